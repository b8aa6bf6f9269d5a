"""E4: characteristic points by hand, the smoke flagfile end to end, restart, bad flags."""

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


# ------------------------------------------------------- By hand, in-process --

def _close(actual, expected):
  np.testing.assert_allclose(actual, np.asarray(expected, np.float64), rtol=1e-12, atol=1e-12)


def test_sp_wn_points_by_hand():
  # SP, 1-D: the kink of ReLU(w x + b) is x = −b/w.
  phi, d = gmp_toys.characteristic_points(
      "sp", {"layer": {"kernel": [[2.0, -1.0]], "bias": [1.0, 3.0]}})
  _close(phi, [[-0.5], [3.0]])
  _close(d, [[1.0], [-1.0]])
  # SP, 2-D: w = (3, 4), b = 10 → φ = −b w/‖w‖² = −0.4·(3, 4), on the line wᵀx + b = 0.
  phi, d = gmp_toys.characteristic_points("sp", {"layer": {"kernel": [[3.0], [4.0]],
                                                           "bias": [10.0]}})
  _close(phi, [[-1.2, -1.6]])
  _close(d, [[0.6, 0.8]])
  # WN: w = g v/‖v‖. v = 3, g = 2 → w = 2, φ = −4/2; v = (0, 5), g = −1 → w = (0, −1).
  phi, _ = gmp_toys.characteristic_points("wn", {"layer": {"kernel": [[3.0]], "scale": [2.0],
                                                           "bias": [4.0]}})
  _close(phi, [[-2.0]])
  phi, d = gmp_toys.characteristic_points("wn", {"layer": {"kernel": [[0.0], [5.0]],
                                                           "scale": [-1.0], "bias": [3.0]}})
  _close(phi, [[0.0, 3.0]])
  _close(d, [[0.0, -1.0]])


def test_bn_point_by_hand():
  # z = γ (x w − μ)/s + β with μ = m w = 2, s = sqrt(w² v) = 4 (ε = 0):
  # 0.5 (2x − 2)/4 + 1 = 0  ⇔  x = −3.
  hidden = {"layer": {"kernel": [[2.0]]}, "norm": {"scale": [0.5], "bias": [1.0]}}
  phi, d = gmp_toys.characteristic_points("bn", hidden, x_mean=[1.0], x_cov=[[4.0]],
                                          bn_epsilon=0.0)
  _close(phi, [[-3.0]])
  _close(d, [[1.0]])
  # A negative γ flips the unit's direction (the active side).
  hidden["norm"]["scale"] = [-0.5]
  phi, d = gmp_toys.characteristic_points("bn", hidden, x_mean=[1.0], x_cov=[[4.0]],
                                          bn_epsilon=0.0)
  _close(phi, [[5.0]])     # −0.5 (2x − 2)/4 + 1 = 0 ⇔ x = 5
  _close(d, [[-1.0]])


def test_gmp_points_by_hand():
  # 1-D: fixed sign u ∈ {±1}, φ = −λ u.
  phi, d = gmp_toys.characteristic_points(
      "gmp", {"layer": {"lam": [0.5, 2.0], "r": [3.0, -1.0]}}, sign=[1.0, -1.0])
  _close(phi, [[-0.5], [2.0]])
  _close(d, [[1.0], [-1.0]])
  # 2-D: u(θ) = (cos θ, sin θ).
  phi, d = gmp_toys.characteristic_points(
      "gmp", {"layer": {"theta": [[math.pi / 2], [0.0]], "lam": [2.0, -1.0], "r": [1.0, 1.0]}})
  _close(phi, [[0.0, -2.0], [1.0, 0.0]])
  np.testing.assert_allclose(d, [[0.0, 1.0], [1.0, 0.0]], atol=1e-15)
  with pytest.raises(ValueError, match="sign"):
    gmp_toys.characteristic_points("gmp", {"layer": {"lam": [1.0], "r": [1.0]}})


def test_hyperspherical_direction_matches_the_library():
  import jax.numpy as jnp
  import orthojax as oj
  theta = np.random.default_rng(0).uniform(0.0, np.pi, (5, 6))
  ours = gmp_toys.hyperspherical_direction(theta)
  lib = np.asarray(oj.nn.angles_to_direction(jnp.asarray(theta, jnp.float32), axis=-1))
  np.testing.assert_allclose(ours, lib, atol=2e-6)
  np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-12)


def test_points_are_on_the_real_layers_boundaries():
  """φ computed from the parameters zeroes the pre-activation of the actual orthojax layers."""
  import jax.numpy as jnp
  from flax import nnx
  from orthojax.models import MLP
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(64, 2)), jnp.float32)
  for variant in ("sp", "wn", "bn", "gmp"):
    model = MLP(2, hidden=5, variant=variant, rngs=nnx.Rngs(3))
    state = nnx.state(model, nnx.Param)
    pure = nnx.to_pure_dict(state)
    pure["hidden"] = {k: {n: (np.asarray(v) + 0.3 * rng.normal(size=np.shape(v))).astype(np.float32)
                          for n, v in d.items()}
                      for k, d in pure["hidden"].items()}  # off the init (λ = b = β = 0)
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)
    params = pure["hidden"]
    unit = model.hidden
    xs = np.asarray(x, np.float64)
    static = {}
    if variant == "bn":
      static = dict(x_mean=xs.mean(0), x_cov=np.cov(xs, rowvar=False, bias=True))
    phi, direction = gmp_toys.characteristic_points(variant, params, **static)
    probe = jnp.asarray(phi, jnp.float32)
    if variant == "gmp":
      # r·ReLU(uᵀx + λ): zero at φ, r·δ a distance δ beyond it along u.
      delta = 0.25
      inside = np.asarray(unit.layer(probe + delta * jnp.asarray(direction, jnp.float32)))
      at = np.asarray(unit.layer(probe))
      r = np.asarray(unit.layer.r[...])
      np.testing.assert_allclose(np.diag(at), 0.0, atol=1e-5)
      np.testing.assert_allclose(np.diag(inside), r * delta, rtol=1e-4, atol=1e-5)
      continue
    pre = unit.layer(probe)
    if variant == "bn":
      # Train-mode BN on the batch x: put x's statistics in the running averages and
      # evaluate in eval mode, so the probe sees exactly the batch statistics.
      z = np.asarray(unit.layer(x), np.float64)
      unit.norm.mean[...] = jnp.asarray(z.mean(0), jnp.float32)
      unit.norm.var[...] = jnp.asarray(z.var(0), jnp.float32)
      model.eval()
      pre = unit.norm(pre)
    np.testing.assert_allclose(np.diag(np.asarray(pre)), 0.0, atol=1e-4)


# ------------------------------------------------------------ Config, runs --

def _base(arg: str = "") -> Config:
  return Config.from_dict(gmp_toys_config.get_config(arg))


def test_runs_set_the_toys_model_data_and_lr_on_the_config_file():
  base = _base()
  assert (base.optimizer["euclidean"]["name"], base.schedule, base.spectrum_every, base.log_every) == (
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
    (dict(spectrum_every=0), "config.spectrum_every=0: E4 needs 1"),
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


def test_parse_options_names_the_flag():
  assert gmp_toys.parse_options("levy_options", ["num_train=50", "noise=0.1", "x=true",
                                                 "s=a"]) == {"num_train": 50, "noise": 0.1,
                                                             "x": True, "s": "a"}
  with pytest.raises(ConfigError, match=r"^--levy_options=num_train: 'num_train': expected"):
    gmp_toys.parse_options("levy_options", ["num_train"])


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
    ("--config.spectrum_every=0", "config.spectrum_every=0: E4 needs 1"),
    ("--levy_options=num_train=50,bumps=3", "--levy_options=num_train=50,bumps=3: levy: "
                                            "unknown option(s) ['bumps']"),
    ("--levy_batch_size=500", "--levy_batch_size=500: larger than the 50 training examples"),
])
def test_bad_flags_fail_fast_with_one_line(tmp_path, flag, message):
  proc = _cli.run("gmp_toys", SMOKE, f"--workdir={tmp_path}", flag, check=False, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: {message}"), last
  assert not (tmp_path / "runs").exists()
