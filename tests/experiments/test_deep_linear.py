"""E7 deep linear: epochs-to-threshold from a metrics log, flag checks, smoke flagfile end to end."""

from __future__ import annotations

import json
import math

from absl import flags
import pytest

from experiments import deep_linear
from orthojax.train import metrics as metrics_lib
from tests.experiments import _cli

SMOKE = "--flagfile=experiments/flags/deep_linear_smoke.flags"


# A hand-written log: train losses at steps 1..6 (the loss at step s is that of the
# parameters after s - 1 updates), eval/spectrum records in between, a NaN, and the
# steps 4..5 written again by a resumed run.
LOG = [
    {"step": 1, "split": "train", "loss": 2.30, "accuracy": 0.1},
    {"step": 2, "split": "train", "loss": 1.10},
    {"step": 2, "split": "eval", "loss": 0.01},           # not a train record
    {"step": 3, "split": "train", "loss": float("nan")},  # never counts
    {"step": 4, "split": "train", "loss": 0.45},
    {"step": 5, "split": "train", "loss": 0.30},
    {"step": 5, "split": "spectrum", "sv_mean": 1.0},
    {"step": 4, "split": "train", "loss": 0.45},          # replayed after a resume
    {"step": 5, "split": "train", "loss": 0.30},
    {"step": 6, "split": "train", "loss": 0.19},
]


@pytest.mark.parametrize("threshold, steps_per_epoch, expected", [
    (3.0, 1, 0.0),      # already below at step 1: no update needed
    (2.30, 1, 0.0),     # "<=" threshold
    (1.5, 1, 1.0),      # step 2
    (0.5, 1, 3.0),      # step 4 (the NaN at step 3 does not count; eval's 0.01 neither)
    (0.3, 1, 4.0),
    (0.2, 1, 5.0),      # the last record
    (0.1, 1, None),     # never reached
    (0.5, 2, 1.5),      # 3 updates at 2 updates per epoch
])
def test_epochs_to_threshold_on_a_hand_written_log(threshold, steps_per_epoch, expected):
  assert deep_linear.epochs_to_threshold(LOG, threshold, steps_per_epoch) == expected


def test_epochs_to_threshold_reads_a_jsonl_file_in_any_order(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in reversed(LOG)) + '{"step": 7, "spl')
  records = metrics_lib.read_jsonl(str(path))        # the torn last line is skipped
  assert deep_linear.epochs_to_threshold(records, 0.5) == 3.0
  summary = deep_linear.run_summary(records, [0.5, 0.1])
  assert summary["epochs_to_threshold"] == {"0.5": 3.0, "0.1": None}
  assert summary["diverged"] and summary["initial_loss"] == 2.30
  assert summary["final_loss"] == 0.19
  with pytest.raises(ValueError, match="steps_per_epoch"):
    deep_linear.epochs_to_threshold(records, 0.5, 0)


@pytest.mark.parametrize("flag, value, message", [
    ("depths", "2,x", "'x' is not an integer"),
    ("depths", "1,4", "1 < 2"),
    ("depths", "4,4", "4 is repeated"),
    ("depths", "", "empty"),
    ("inits", "orthogonal,identity", "unknown 'identity'"),
    ("loss_thresholds", "0.5,-1", "-1 must be > 0"),
    ("loss_thresholds", "a", "'a' is not a number"),
    ("lr_scaling", "sqrt", "value should be one of"),
])
def test_flags_name_the_bad_value(flag, value, message):
  with pytest.raises(ValueError) as e:
    flags.FLAGS[flag].parser.parse(value)
  assert str(e.value).startswith(message)
  parse = lambda name, value: flags.FLAGS[name].parser.parse(value)
  assert (parse("depths", "2,8"), parse("inits", "gaussian"),
          parse("loss_thresholds", "0.5,0.2")) == ([2, 8], ["gaussian"], [0.5, 0.2])


def test_smoke_flagfile_runs_and_reports(tmp_path):
  # Runs with the same program (same depth / penalty kind) share XLA compilations: the
  # session's cache (tests/compile_cache.py).
  workdir = tmp_path / "e7"
  proc = _cli.run("deep_linear", SMOKE, f"--workdir={workdir}")
  results = json.loads((workdir / "results.json").read_text())
  assert results["experiment"] == "deep_linear"
  rows = {(r["setting"]["depth"], r["setting"]["init"], r["metric"]): r for r in results["rows"]}
  expected = {(d, i, f"epochs to train loss ≤ {t}") for d in (2, 8)
              for i in ("orthogonal", "gaussian") for t in ("0.5", "0.05")}
  assert set(rows) == expected
  for (depth, init, metric), row in rows.items():
    assert row["paper"] is None and row["paper"] == deep_linear.PAPER.get((depth, init))
    assert row["n"] == 2 and len(row["ours"]) == 2
    if metric.endswith("0.5"):
      # Reached well inside the 40 epochs (≈ 10–20 from an initial loss ≈ 2.3–3), whole epochs.
      assert all(3 <= v <= 30 and v == int(v) for v in row["ours"]), row
      assert row["note"] == ""
    else:   # out of reach in 40 epochs: censored at the cap, and said so
      assert row["ours"] == [40.0, 40.0]
      assert row["note"].startswith("2/2 not reached in 40 epochs")
  report = (workdir / "report.md").read_text()
  assert "| 8 | gaussian | epochs to train loss ≤ 0.5 | — |" in report
  assert "plot only" in report
  for name in ("deep_linear_epochs.png", "deep_linear_loss.png"):
    png = (workdir / name).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
  assert "Report: " in proc.stdout and proc.stdout.count("Plot: ") == 2

  # Each run's record and log: 40 full-batch epochs, finite losses falling from ≈ ln 10,
  # and the stored epochs-to-threshold agree with the log.
  for depth in (2, 8):
    for init in ("orthogonal", "gaussian"):
      for seed in (0, 1):
        run_dir = workdir / f"runs/depth={depth}/init={init}/seed={seed}"
        record = json.loads((run_dir / "result.json").read_text())
        assert record["final_step"] == 40 and record["tags"] == {
            "depth": depth, "init": init, "seed": seed}
        log = metrics_lib.read_jsonl(str(run_dir / "metrics.jsonl"))
        losses = [r["loss"] for r in log if r["split"] == "train"]
        assert len(losses) == 40 and all(math.isfinite(v) for v in losses)
        assert 1.0 < losses[0] < 6.0 and losses[-1] < 0.5 * losses[0]
        assert not record["diverged"]
        assert record["epochs_to_threshold"]["0.5"] == deep_linear.epochs_to_threshold(log, 0.5)
        assert record["epochs_to_threshold"]["0.05"] is None
        assert rows[(depth, init, "epochs to train loss ≤ 0.5")]["ours"][seed] == (
            record["epochs_to_threshold"]["0.5"])


@pytest.mark.parametrize("flags, message", [
    (["--depths=2,x"], "--depths=2,x: 'x' is not an integer"),
    (["--lr_scaling=sqrt"], "--lr_scaling=sqrt: value should be one of <inverse_depth|constant>"),
    (["--config.loss=mse"], "config.loss='mse': digits is a classification set"),
    (["--config.model.depth=4"], "config.model.depth=4: E7 sets it per run (each depth of "
                                 "--depths)"),
    (["--config.batch_size=64"], "config.batch_size=64: E7 sets it per run (the whole "
                                 "training set"),
    (["--config.model.width=0"], "config.model.width: the deep linear network's hidden width"),
])
def test_bad_flags_fail_fast_with_one_line(tmp_path, flags, message):
  proc = _cli.forked("deep_linear", SMOKE, f"--workdir={tmp_path}", *flags)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert lines[-1].startswith(f"error: {message}"), proc.stderr
  assert not (tmp_path / "runs").exists()


def test_plots_name_the_data_the_depths_the_thresholds_and_the_cap(tmp_path, monkeypatch):
  from experiments import _harness
  figures = []
  monkeypatch.setattr(_harness, "save_figure", lambda fig, path, dpi=110: figures.append(fig))
  rows = [_harness.Row({"depth": d, "init": init}, metric, values, None, note)
          for metric, values, note in (("epochs to train loss ≤ 0.5", [10.0, 12.0], ""),
                                       ("epochs to train loss ≤ 0.05", [40.0, 40.0],
                                        "not reached by 2/2"))
          for d in (2, 8) for init in ("orthogonal", "gaussian")]
  deep_linear.plot_epochs(rows, str(tmp_path / "e.png"), 40, "digits, 2 seeds")
  curves = {(d, "orthogonal"): [[3.0, 1.0, 0.4], [3.0, 1.2, 0.3]] for d in (2, 8)}
  deep_linear.plot_losses(curves, (0.5, 0.05), str(tmp_path / "l.png"), "digits, 2 seeds")
  epochs, losses = figures
  epochs.canvas.draw()
  for ax in epochs.axes:   # the depths themselves, not 2^1, 2^3
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "8"]
  censored = [t.get_text() for t in epochs.axes[1].get_legend().get_texts()]
  assert censored[0] == "40 epochs: not reached (censored, a lower bound)"
  assert "E7 deep linear, digits, 2 seeds" in epochs.get_suptitle()
  assert "E7 deep linear, digits, 2 seeds" in losses.get_suptitle()
  assert "thresholds (0.5, 0.05)" in [t.get_text() for t in
                                      losses.axes[0].get_legend().get_texts()]
