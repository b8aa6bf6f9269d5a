"""A finished run is reused only for the config that produced it, as a user meets it: the
same command rerun reads it back; with another model it stops in one line naming the key,
exit 2, before the header and before any run trains, and the workdir keeps its report
(``experiments._harness.fingerprints``). The unit cases (the keys that may differ, a record
from before the check, the probe's cells, included workdirs): test_runs.py and
test_harness_stages.py."""

from __future__ import annotations

from tests.experiments import _cli
from tests.experiments.test_lm import corpus_dir  # noqa: F401  (a session fixture)


def _refused(proc, run_dir, diff):
  """``proc`` stopped in one line: the run in ``run_dir`` is of another config (``diff``)."""
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert errors == [f"error: {run_dir}: its finished run {diff}; rerun with that config or "
                    f"use a new --workdir"], proc.stderr[-2000:]
  assert "runs (" not in proc.stdout and "Report:" not in proc.stdout   # no header, no report


def test_e8_reruns_its_finished_run_only_with_its_config(tmp_path, corpus_dir):  # noqa: F811
  """The issue's commands: the 2 × 32 AdamW run, then the same with a width of 64 (refused,
  naming config.model.width), then the same command again (read back)."""
  workdir = tmp_path / "e8"
  args = ("--flagfile=experiments/flags/lm_smoke.flags",
          f"--config.data.data_dir={corpus_dir}", "--config.data.download=false",
          "--stages=train", "--num_seeds=1", "--arms=adamw", f"--workdir={workdir}")
  _cli.run("lm", *args)
  report = (workdir / "report.md").read_text()
  wide = _cli.forked("lm", *args, "--config.model.width=64")
  _refused(wide, workdir / "runs/arm=adamw/seed=0",
           "(step 40) is of another config: config.model.width=64 (finished run: 32)")
  assert (workdir / "report.md").read_text() == report   # the report stays the 2 × 32 run's
  same = _cli.forked("lm", *args)
  assert same.returncode == 0, same.stderr[-2000:]
  assert "arm=adamw/seed=0: done earlier (step 40, test loss" in same.stdout


def test_e3_reruns_its_finished_run_only_with_its_config(tmp_path):
  """E3 (UCI) likewise: a hidden layer of 64 against the finished run's 100."""
  workdir = tmp_path / "uci"
  args = ("--flagfile=experiments/flags/uci_smoke.flags", "--variants=sp", "--num_splits=1",
          f"--workdir={workdir}")
  _cli.run("uci", *args)
  wide, same = _cli.run_each("uci", [(*args, "--config.model.hidden=64"), args])
  _refused(wide, workdir / "runs/dataset=boston/variant=sp/split=0",
           "(step 30) is of another config: config.model.hidden=64 (finished run: 100)")
  assert same.returncode == 0, same.stderr[-2000:]
  assert "dataset=boston/variant=sp/split=0: done earlier" in same.stdout
