"""The pod compile check: real TPU executables from libtpu for small jobs on v5e:2x2.

Checks numbers, not just that it compiles: FLOPs per example against a closed
form count of the matmuls, loop bodies counted per iteration (an HLO scan
against the same closed form), per-chip state bytes falling as 1/fsdp with
all-gathers in the HLO, a two-slice mesh, the too-big error's one line, bad
topologies / meshes / slice counts, and that the compile check builds the
very step the run executes (same jaxpr on CPU devices and on TPU devices).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from orthojax.compile import aot
from orthojax.compile import hlo
from orthojax.compile import topology
from orthojax.train import data as data_lib
from orthojax.train.config import Config
from orthojax.train.config import ConfigError
from orthojax.train.program import build_program
from orthojax.train.program import compile_program
from tests.experiments import _cli

pytestmark = pytest.mark.skipif(not topology.libtpu_available(),
                                reason="libtpu is not installed (pip install -e '.[test]')")

WIDTH, DEPTH, BATCH = 256, 6, 256


def _deep_mlp(**changes) -> Config:
  base = Config(model={"name": "DeepMLP", "depth": DEPTH, "width": WIDTH, "init": "orthogonal"},
                data={"name": "digits", "flatten": True}, batch_size=BATCH, num_steps=10,
                optimizer={"euclidean": {"name": "sgd", "learning_rate": 0.1}},
                compute_dtype="bfloat16")
  return base.replace(**changes)


def _matmul_flops_per_example(features: int, width: int, hidden_layers: int, classes: int) -> int:
  """Forward 2·fan_in·fan_out per layer; backward twice that, except the first layer's
  input gradient, which nobody needs."""
  layers = [(features, width)] + [(width, width)] * hidden_layers + [(width, classes)]
  forward = sum(2 * a * b for a, b in layers)
  return 3 * forward - 2 * features * width


@pytest.fixture(scope="module")
def data_report():
  return aot.compile_for(_deep_mlp(), "v5e:2x2")


@pytest.fixture(scope="module")
def fsdp_report():
  return aot.compile_for(_deep_mlp(mesh={"data": 1, "fsdp": -1}), "v5e:2x2")


def test_topology_table_and_names():
  t = topology.Topology.parse("v4:2x2x4")
  assert (t.num_chips, t.chip.megacore, t.chip.peak_bf16_flops) == (16, True, 275e12)
  assert len(t.devices()) == 16   # megacore: one device per chip, not per TensorCore
  two = topology.Topology.parse("v5e:2x2", num_slices=2)
  assert {d.slice_index for d in two.devices()} == {0, 1}
  for bad in ("v5e", "v7x:2x2", "v5e:2x0", "tpu-v5e-16", "", "h100:8", "h100:1x2x2x2"):
    with pytest.raises(topology.TopologyError, match="--compile_for"):
      topology.Topology.parse(bad)


def test_scan_flops_are_counted_per_iteration():
  """A scanned stack of L matmuls: XLA counts the body once, the report L times."""
  devices = topology.Topology.parse("v5e:2x2").devices()
  mesh = jax.make_mesh((1, 4), ("data", "fsdp"), devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  layers, n, batch = 10, 256, 128

  def loss(ws, x):
    h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
    return jnp.sum(h ** 2)

  w_sh, x_sh = NamedSharding(mesh, P(None, None, "fsdp")), NamedSharding(mesh, P("fsdp"))
  compiled = jax.jit(jax.grad(loss), in_shardings=(w_sh, x_sh), out_shardings=w_sh).lower(
      jax.ShapeDtypeStruct((layers, n, n), jnp.float32, sharding=w_sh),
      jax.ShapeDtypeStruct((batch, n), jnp.float32, sharding=x_sh)).compile()
  report = aot.StepReport.of(compiled)
  analytic = 3 * 2 * batch * n * n * layers / 4   # per chip
  assert report.xla_flops < 0.2 * analytic          # XLA alone: one iteration's worth
  assert report.flops == pytest.approx(analytic, rel=0.01)
  assert report.unknown_loops == 0
  assert "all-gather" in report.collectives          # fsdp: weights gathered per layer
  assert report.collectives["all-gather"]["count"] >= layers


def test_flops_per_example_match_the_matmul_count(data_report):
  info = data_lib.dataset_info("digits", flatten=True)
  analytic = _matmul_flops_per_example(64, WIDTH, DEPTH, info.num_classes)
  assert data_report.flops_per_example == pytest.approx(analytic, rel=0.05)
  assert data_report.num_chips == 4 and data_report.per_chip_batch == BATCH / 4
  assert data_report.fits and data_report.chip.name == "v5e"


def test_report_fields_and_roofline(data_report, tmp_path):
  r = data_report
  m = r.train.memory
  assert m["total"] == m["arguments"] + m["outputs"] - m["aliased"] + m["temporaries"] + m["code"]
  assert m["aliased"] > 0            # the donated train state is updated in place
  bound = max(r.train.flops / 197e12, r.train.bytes_accessed / 819e9)
  assert r.step_seconds_bound == pytest.approx(bound)
  assert r.examples_per_sec_per_chip_bound == pytest.approx(BATCH / 4 / bound)
  assert "all-gather" not in r.train.collectives and "all-reduce" in r.train.collectives
  path = aot.write_reports(str(tmp_path), {"run": r})
  saved = json.loads(open(path).read())["run"]
  for key in ("num_chips", "global_batch", "per_chip_batch", "flops_per_example",
              "step_seconds_bound", "examples_per_sec_per_chip_bound", "hbm_capacity", "fits",
              "compile_seconds"):
    assert key in saved, key
  assert set(saved["train"]["memory"]) == {"arguments", "outputs", "aliased", "temporaries",
                                           "code", "total"}
  assert "HBM per chip" in r.table() and "roofline" in r.table()


def test_traffic_by_scope_adds_up_to_xla_bytes_and_names_the_optimizer(data_report):
  """Counted once per loop body, the per-scope split is near XLA's own byte count
  (within 20 %: it is estimated from shapes); weighted by trip count, near the
  report's total. It charges the SGD
  update to ``optimizer`` and the network to ``loss_and_grad``; a Riemannian Adam with
  the Cayley retraction shows its retraction as its own scope."""
  t = data_report.train
  program = build_program(_deep_mlp(), data_lib.dataset_info("digits", flatten=True),
                          devices=topology.Topology.parse("v5e:2x2").devices())
  module = hlo.Module.from_text(compile_program(program).train_step.as_text())
  once = sum(module.traffic_by_scope(1, weighted=False).values())
  assert once == pytest.approx(t.xla_bytes_accessed, rel=0.2)
  assert sum(t.traffic_by_scope.values()) == pytest.approx(t.bytes_accessed, rel=0.2)
  # The scanned stack (6 layers) runs its body 6 times: XLA's count misses 5 of them.
  weighted = sum(module.traffic_by_scope(1).values())
  assert t.bytes_accessed == pytest.approx(t.xla_bytes_accessed + weighted - once)
  assert t.bytes_accessed > 1.2 * t.xla_bytes_accessed
  named = {k: v for k, v in t.traffic_by_scope.items() if not k.startswith("(")}
  assert max(named, key=named.get) == "loss_and_grad"
  assert any(k.startswith("optimizer") for k in t.traffic_by_scope)
  stiefel = aot.compile_for(_deep_mlp(
      model={"depth": 2, "weights": "stiefel"},
      optimizer={"stiefel": {"name": "radam", "learning_rate": 0.1,
                             "manifold": {"name": "Stiefel", "retraction": "cayley",
                                          "cayley_iterations": 2}}}), "v5e:2x2").train
  assert sum(stiefel.traffic_by_scope.values()) == pytest.approx(stiefel.bytes_accessed,
                                                                 rel=0.3)
  assert stiefel.traffic_by_scope.get("optimizer/fused_stiefel_adam/retraction", 0) > 0
  assert "HBM traffic by scope" in data_report.table()


def test_one_pass_products_count_once_on_the_matrix_unit(data_report):
  t = data_report.train
  assert t.matrix_unit_flops == pytest.approx(t.matmul_flops) and t.matmul_flops > 0
  assert "matrix-unit FLOPs" not in data_report.table()


def test_fsdp_shards_state_and_gathers(data_report, fsdp_report):
  params_and_state = lambda r: r.train.memory["arguments"]
  # Parameters (+ momentum-free SGD state) dominate the arguments: 4-way fsdp ≈ 1/4.
  assert params_and_state(fsdp_report) < 0.4 * params_and_state(data_report)
  assert "all-gather" in fsdp_report.train.collectives
  assert fsdp_report.mesh == {"data": 1, "fsdp": 4, "model": 1}


def test_two_slices_put_data_parallelism_across_them():
  report = aot.compile_for(_deep_mlp(model={"depth": 2}), "v5e:2x2", num_slices=2)
  assert (report.num_chips, report.num_slices, report.mesh["data"]) == (8, 2, 8)
  assert "all-reduce" in report.train.collectives
  with pytest.raises(ValueError, match="config.mesh.num_slices=2"):
    aot.compile_for(_deep_mlp(model={"depth": 2}, mesh={"data": 1, "fsdp": -1}), "v5e:2x2",
                    num_slices=2)


def test_too_big_is_one_line_naming_what_to_change(data_report):
  """Too big either way: the TPU compiler refuses (2.7e9 float32 params with Adam), or
  the memory analysis exceeds the chip (the small job on a chip of 1 MiB)."""
  huge = _deep_mlp(model={"width": 8192, "depth": 40}, batch_size=8, compute_dtype="float32",
                   optimizer={"euclidean": {"name": "adam"}})
  with pytest.raises(aot.DoesNotFitError) as err:
    aot.compile_for(huge, "v5e:2x2")
  tiny_chip = dataclasses.replace(data_report.chip, hbm_bytes=2 ** 20)
  report = dataclasses.replace(data_report, chip=tiny_chip)
  assert not report.fits
  with pytest.raises(aot.DoesNotFitError) as err2:
    report.check_fits(_deep_mlp())
  assert "arguments take" in str(err2.value) and "has 16 GiB" in str(err.value)
  for message in (str(err.value), str(err2.value)):
    assert "\n" not in message and "per chip" in message, message
    assert "config.mesh.fsdp" in message and "config.grad_accum_steps" in message, message


def test_compile_check_builds_the_step_the_run_uses():
  """Same config on 4 CPU devices and on 4 abstract TPU chips: one jaxpr."""
  config = _deep_mlp(model={"depth": 2, "weights": "stiefel"},
                     optimizer={"stiefel": {"name": "radam", "learning_rate": 0.1}})
  info = data_lib.dataset_info("digits", flatten=True)
  cpu = build_program(config, info, devices=jax.devices()[:4])
  tpu = build_program(config, info, devices=topology.Topology.parse("v5e:2x2").devices())
  unsharded = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
  jaxpr = lambda p: str(jax.make_jaxpr(p.step_fn)(unsharded(jax.eval_shape(p.init)),
                                                 unsharded(p.abstract_batch())))
  assert jaxpr(cpu) == jaxpr(tpu)


def _cuda_plugin() -> bool:
  try:
    import jax_plugins.xla_cuda12  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


@pytest.mark.skipif(not _cuda_plugin(), reason="deviceless GPU compiles need the "
                    "gpu-compile extra (jax's CUDA plugin), which CI does not install")
def test_h100_deviceless_compile_counts_the_same_flops(data_report):
  report = aot.compile_for(_deep_mlp(), "h100:1x1x4")
  assert report.chip.platform == "cuda" and report.num_chips == 4
  assert report.train.memory["arguments"] > 0
  assert report.flops_per_example == pytest.approx(data_report.flops_per_example, rel=0.02)


def test_bad_config_for_the_topology():
  with pytest.raises(ConfigError, match="config.batch_size=6"):
    aot.compile_for(_deep_mlp(batch_size=6), "v5e:2x2")
  with pytest.raises(ValueError, match="mesh"):
    aot.compile_for(_deep_mlp(mesh={"data": 3}), "v5e:2x2")


@pytest.mark.parametrize("args,expected", [
    (("--compile_for=v9z:2x2",), "unknown topology"),
    (("--compile_for=v5e:2x2", "--config.mesh.data=3"), "mesh"),
    (("--compile_for=v5e:2x2", "--config.mesh.num_slices=2", "--config.batch_size=12"),
     "config.batch_size=12"),
])
def test_cli_bad_input_is_one_line_exit_1_nothing_written(tmp_path, args, expected):
  workdir = tmp_path / "w"
  proc = _cli.run("train", "--config.num_steps=2", "--config.batch_size=8",
                  f"--workdir={workdir}", *args, check=False)
  assert proc.returncode == 1, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.strip().splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and expected in lines[0], proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert not workdir.exists()


def test_cli_writes_the_report(tmp_path):
  workdir = tmp_path / "w"
  proc = _cli.run("train", "--config.num_steps=2", "--config.batch_size=8",
                  f"--workdir={workdir}", "--compile_for=v5e:2x2")
  assert "HBM per chip" in proc.stdout and "FLOPs per example" in proc.stdout
  report = json.loads((workdir / aot.REPORT).read_text())["run"]
  assert report["num_chips"] == 4 and report["fits"]
  assert os.listdir(workdir) == [aot.REPORT]   # compiled, nothing trained


def test_the_qr_retractions_guards_are_counted_beside_the_step():
  """Radam with the guarded QR (CholeskyQR2) on a 2-layer Stiefel stack: the headline
  counts the one-pass step; ``guarded_flops`` (XLA's rule, every cond at its costliest
  branch) adds at least the second pass's Gram product, ``2 n p²`` per matrix, and the
  table prints it on its own line. The default QR (one CholeskyQR pass) has no guard:
  its compiled step is the headline's, with no conditional."""
  depth = 2
  reports = {algorithm: aot.compile_for(_deep_mlp(
      model={"depth": depth, "weights": "stiefel"},
      optimizer={"stiefel": {"name": "radam", "learning_rate": 0.1,
                             "manifold": {"name": "Stiefel", "retraction": "qr",
                                          "qr_algorithm": algorithm}}}), "v5e:2x2")
      for algorithm in ("cholesky_qr2", "cholesky_qr")}
  report = reports["cholesky_qr2"]
  t = report.train
  assert t.guarded_flops - t.flops >= 2 * WIDTH ** 3 * depth / report.num_chips
  assert t.guarded_bytes_accessed > t.bytes_accessed
  assert "with every guard's fall-back" in report.table()
  one_pass = reports["cholesky_qr"].train
  assert one_pass.guarded_flops == one_pass.flops
  assert one_pass.guarded_bytes_accessed == one_pass.bytes_accessed
  assert "with every guard's fall-back" not in reports["cholesky_qr"].table()
  # The guarded step when no guard fires, less, on each matrix a chip owns, the one-pass
  # test's two probe products (n x p x 8 each) and the float32 correction's two n x p x p
  # products: on a TPU the one pass runs at float32 instead (manifolds.Stiefel.retract).
  owned = -(-depth // report.num_chips)
  probes, correction = 2 * (2 * WIDTH * WIDTH * 8), 2 * (2 * WIDTH ** 3)
  assert t.matmul_flops - one_pass.matmul_flops == (probes + correction) * owned
  assert one_pass.bytes_accessed < t.bytes_accessed
  assert "matrix-unit FLOPs per step" in report.table()
