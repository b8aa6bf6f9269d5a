"""Sharding overhead: the same training run on 8 simulated CPU devices vs. 1 device.

The full :func:`orthojax.train.trainer.train` loop (input, global-batch
assembly with ``jax.make_array_from_process_local_data``, the jitted step,
metrics) trains a 16-layer, width-512 tanh ``DeepMLP`` (scanned layers) on
the ``fake`` dataset at 32×32 with a global batch of 256, three ways: one device; an 8-way ``data`` mesh; an 8-way
``fsdp`` mesh (parameters and optimizer state sharded). The steady-state
rate is the median of the ``steps_per_sec`` the trainer logs after the first
(compiling) interval.

Simulated devices split one CPU's cores, so on a CPU this measures the cost
of the partitioning (collectives, per-device launch overhead), not a
speed-up: report only. XLA needs the device count before jax starts, so the
measurement runs in a child process with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks._harness import Row
from benchmarks._harness import row

SUITE = "sharding"
_MESHES = {"1 device": {"data": 1}, "data=8": {"data": 8}, "fsdp=8": {"data": 1, "fsdp": 8}}


def _child(num_steps: int) -> dict[str, float]:
  """In the child process: steps/s of each mesh."""
  import jax  # pylint: disable=g-import-not-at-top
  from orthojax.train import metrics  # pylint: disable=g-import-not-at-top
  from orthojax.train import trainer  # pylint: disable=g-import-not-at-top
  from orthojax.train.config import Config  # pylint: disable=g-import-not-at-top

  base = Config(model={"name": "DeepMLP", "depth": 16, "width": 512, "activation": "tanh",
                       "init": "gaussian"},
                data={"name": "fake", "height": 32, "width": 32, "num_classes": 10,
                      "num_train": 256 * num_steps, "num_eval": 256},
                batch_size=256, num_steps=num_steps,
                optimizer={"euclidean": {"name": "sgd", "learning_rate": 0.01, "momentum": 0.9}},
                log_every=2)
  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    for name, mesh in _MESHES.items():
      workdir = os.path.join(tmp, name.replace(" ", "_").replace("=", ""))
      devices = jax.devices()[:1] if name == "1 device" else jax.devices()[:8]
      trainer.train(base.replace(workdir=workdir, mesh=mesh), devices=devices,
                    print_fn=lambda line: None)
      rates = [r["steps_per_sec"] for r in metrics.read_jsonl(f"{workdir}/metrics.jsonl")
               if r["split"] == "train" and "steps_per_sec" in r]
      out[name] = statistics.median(rates[1:] or rates)
  return out


def run(quick: bool = False) -> list[Row]:
  num_steps = 8 if quick else 24
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-m", "benchmarks.sharding_bench", str(num_steps)],
                        env=env, capture_output=True, text=True, timeout=1200)
  if proc.returncode != 0:
    raise RuntimeError(f"sharding benchmark child failed:\n{proc.stderr[-3000:]}")
  rates = json.loads(proc.stdout.strip().splitlines()[-1])
  rows = [row(SUITE, f"DeepMLP 16x512, fake 32², global batch 256, {name}", 1e3 / rates[name], "ms",
              note="per training step, trainer loop, median") for name in _MESHES]
  for name in ("data=8", "fsdp=8"):
    rows.append(row(SUITE, f"{name} / 1 device step time (8 simulated CPU devices)",
                    rates["1 device"] / rates[name], "x",
                    note="partitioning overhead on one CPU; report only"))
  return rows


if __name__ == "__main__":
  print(json.dumps(_child(int(sys.argv[1]))))
