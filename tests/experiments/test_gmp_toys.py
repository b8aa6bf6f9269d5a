"""E4 (characteristic points: tests/analysis): the config, the smoke flagfile end to end, restart, bad flags."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import jax
import pytest

from experiments import _harness
from experiments import gmp_toys
from experiments.configs import gmp_toys as gmp_toys_config
from orthojax.train import program
from orthojax.train.config import Config
from orthojax.train.config import ConfigError
from tests.experiments import _cli

SMOKE = "--flagfile=experiments/flags/gmp_toys_smoke.flags"
PNG = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------ Config, runs --

def _base(arg: str = "") -> Config:
  return Config.from_dict(gmp_toys_config.get_config(arg))


def test_runs_set_the_toys_model_data_and_lr_on_the_config_file():
  base = _base()
  assert (base.optimizer["euclidean"]["name"], base.schedule, base.hooks.every_steps,
          base.log_every) == (
      "adam", "constant", 1, 1000)
  assert _base("smoke").replace(log_every=1000) == base
  _check(base)
  options = {"levy": {"num_train": 50, "noise": 0.1, "num_test": 201},
             "banana": {"num_train": 800, "num_test": 200, "noise": 0.1}}
  plan = gmp_toys.plan_runs(base, ["levy", "banana"], ["bn"], [0.1], [3],
                            steps={"levy": 60, "banana": 40},
                            batch_sizes={"levy": 50, "banana": 128}, options=options,
                            levy_loss="mae")
  levy, banana = (r.config for r in plan)
  assert levy.model == {"name": "MLP", "hidden": 100, "variant": "bn", "activation": "relu",
                        "gmp_init_direction": "gaussian", "gmp_init_radius": "one",
                        "momentum": 0.99, "epsilon": gmp_toys.BN_EPSILON}
  assert banana.model["hidden"] == 10
  assert levy.data == {"name": "levy", "num_train": 50, "noise": 0.1, "num_test": 201}
  assert (levy.loss, banana.loss) == ("mae", "cross_entropy")
  assert (levy.num_steps, levy.batch_size, banana.num_steps, banana.batch_size) == (60, 50, 40,
                                                                                    128)
  assert levy.learning_rate == banana.learning_rate == 0.1 and levy.seed == 3
  assert (levy.mesh.data, levy.mesh.fsdp, levy.mesh.model) == (1, 1, 1)
  for config in (levy, banana):
    program.check(config, devices=jax.devices()[:1])   # built as the run will be


def _check(base):
  _harness.check_fixed(base, gmp_toys.PER_RUN_KEYS, "E4", gmp_toys.REQUIRED)


@pytest.mark.parametrize("changes, message", [
    (dict(hooks={"every_steps": 0}), "config.hooks.every_steps=0: E4 needs 1"),
    (dict(data={"num_train": 10}), "config.data.num_train=10: E4 sets it per run"),
    (dict(model={"name": "DeepMLP"}), "config.model.name='DeepMLP': E4 needs 'MLP'"),
    (dict(model={"hidden": 5}), "config.model.hidden=5: E4 sets it per run (its toy"),
    (dict(model={"variant": "gmp"}), "config.model.variant='gmp': E4 sets it per run"),
    (dict(model={"activation": "tanh"}), "config.model.activation='tanh': E4 needs 'relu' (the "
                                         "characteristic points are ReLU kinks)"),
])
def test_experiment_rules_name_the_bad_key(changes, message):
  with pytest.raises(ConfigError) as e:
    _check(_base().replace(**changes))
  assert str(e.value).startswith(message)


def test_parse_options_types_values_as_the_data_set_declares_them():
  assert gmp_toys.parse_options("levy", ["num_train=50", "noise=0.1"]) == {"num_train": 50,
                                                                           "noise": 0.1}
  assert gmp_toys.parse_options("levy", ["noise=1"]) == {"noise": 1.0}   # a float option
  for pairs, message in ((["num_train"], r"^--levy_options=num_train: 'num_train': expected"),
                         (["x=true"], r"^--levy_options=x=true: levy: unknown option"),
                         (["num_train=0.5"], r"^--levy_options=num_train=0.5: levy: option "
                                             r"num_train='0.5' should be a int")):
    with pytest.raises(ConfigError, match=message):
      gmp_toys.parse_options("levy", pairs)


# -------------------------------------------------------------- End to end --

def _png(path) -> bool:
  with open(path, "rb") as f:
    head = f.read(8)
  return head == PNG and os.path.getsize(path) > 5000


def test_smoke_flagfile_tracks_every_step_and_reports_beside_the_paper(tmp_path):
  workdir = tmp_path / "toys"
  proc = _cli.run("gmp_toys", SMOKE, f"--workdir={workdir}", timeout=300)
  results = json.loads((workdir / "results.json").read_text())
  assert results["experiment"] == "gmp_toys"
  rows = {(r["setting"]["toy"], r["setting"]["variant"], r["setting"]["lr"], r["metric"]): r
          for r in results["rows"]}
  expected = {(toy, v, 0.1, m) for toy in ("levy", "banana") for v in ("sp", "gmp")
              for m in gmp_toys.METRICS[toy]}
  assert set(rows) == expected
  for (toy, variant, lr, metric), row in rows.items():
    paper = gmp_toys.PAPER.get((toy, metric, variant, lr))
    assert row["paper"] == (paper[0] if paper else None), (toy, variant, metric)
    assert row["n"] == 1 and all(math.isfinite(v) for v in row["ours"]), row
  assert rows[("levy", "sp", 0.1, gmp_toys.M_DPHI)]["paper"] == 2.0 ** 16
  assert rows[("levy", "gmp", 0.1, gmp_toys.M_DPHI)]["paper"] == 1.0
  # GmP + Adam: λ moves by about lr per step and φ = −λ·u, so the change stays < 1.
  assert rows[("levy", "gmp", 0.1, gmp_toys.M_DPHI)]["ours"][0] < 1.0
  assert "holds" in rows[("levy", "gmp", 0.1, gmp_toys.M_GE1)]["note"]
  assert 0.0 <= rows[("banana", "gmp", 0.1, gmp_toys.M_ACC)]["ours"][0] <= 100.0
  report = (workdir / "report.md").read_text()
  assert "| levy | gmp | 0.1 | max per-step max_i ‖Δφ_i‖ | 1.000 |" in report

  # Trajectories: the initial point and one point after every step, for every unit.
  for toy, steps, units, dim in (("levy", 60, 100, 1), ("banana", 40, 10, 2)):
    for variant in ("sp", "gmp"):
      run = workdir / "runs" / f"toy={toy}/variant={variant}/lr=0.1/seed=0"
      with np.load(run / "trajectory.npz") as z:
        np.testing.assert_array_equal(z["steps"], np.arange(steps + 1))
        assert z["phi"].shape == (steps + 1, units, dim)
        assert z["direction"].shape == (steps + 1, units, dim)
        assert z["max_dphi"].shape == (steps,) and np.all(np.isfinite(z["max_dphi"]))
        np.testing.assert_allclose(
            z["max_dphi"], np.max(np.linalg.norm(np.diff(z["phi"].astype(np.float64), axis=0),
                                                 axis=2), axis=1), rtol=1e-5, atol=1e-6)
        max_dphi = float(np.max(z["max_dphi"]))
      record = json.loads((run / "result.json").read_text())
      assert record["toy"]["tracked_steps"] == steps
      assert record["toy"]["max_dphi"] == pytest.approx(max_dphi)
      logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
      spectrum = [r["step"] for r in logged if r["split"] == "spectrum"]
      assert spectrum == list(range(1, steps + 1))
      if variant == "gmp" and toy == "levy":   # fixed sign in 1-D: the direction never turns
        assert record["toy"]["max_dangle_deg"] == 0.0
  for name in ("levy_trajectories", "levy_per_step_change", "levy_fit", "banana_trajectories",
               "banana_per_step_change", "banana_fit"):
    assert _png(workdir / f"{name}.png"), name
    assert f"Plot: {workdir / name}.png" in proc.stdout

  # An unfinished run (no result.json) is retrained from scratch with a full trajectory;
  # finished ones are read back.
  unfinished = workdir / "runs/toy=banana/variant=gmp/lr=0.1/seed=0"
  (unfinished / "result.json").unlink()
  again = _cli.run("gmp_toys", SMOKE, f"--workdir={workdir}", timeout=300)
  assert again.stdout.count("done earlier") == 3
  assert "Resumed" not in again.stdout
  with np.load(unfinished / "trajectory.npz") as z:
    np.testing.assert_array_equal(z["steps"], np.arange(41))


@pytest.mark.parametrize("flag, message", [
    ("--toy_variants=sp,gmp2", "--toy_variants=sp,gmp2: unknown 'gmp2'"),
    ("--toy_lrs=0.1,fast", "--toy_lrs=0.1,fast: 'fast' is not a number"),
    ("--config.hooks.every_steps=0", "config.hooks.every_steps=0: E4 needs 1"),
    ("--levy_options=num_train=50,bumps=3", "--levy_options=num_train=50,bumps=3: levy: "
                                            "unknown option(s) ['bumps']"),
    ("--levy_batch_size=500", "--levy_batch_size=500: larger than the 50 training examples"),
])
def test_bad_flags_fail_fast_with_one_line(tmp_path, flag, message):
  proc = _cli.forked("gmp_toys", SMOKE, f"--workdir={tmp_path}", flag)
  assert proc.returncode == 2, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: {message}"), last
  assert not (tmp_path / "runs").exists()
