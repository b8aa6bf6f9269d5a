"""E3 end to end on the bundled Boston data: smoke flagfile, report, resume, bad flags."""

from __future__ import annotations

import json
import math

import jax
import pytest

from experiments import _harness
from experiments import uci
from experiments.configs import uci as uci_config
from orthojax.train import program
from orthojax.train.config import Config
from tests.experiments import _cli


def test_config_file_is_the_released_recipe():
  base = Config.from_dict(uci_config.get_config())
  assert base.model == {"name": "MLP", "hidden": 100, "activation": "relu",
                        "gmp_init_direction": "gaussian", "gmp_init_radius": "one",
                        "momentum": 0.99, "epsilon": 1e-3}
  assert base.optimizer["euclidean"]["name"] == "adam" and base.learning_rate == 0.01
  assert (base.loss, base.num_steps, base.schedule, base.plateau_factor, base.plateau_patience,
          base.early_stopping_patience, base.restore_best, base.eval_every) == (
              "mae", 5000, "plateau", 0.1, 50, 100, True, 1)
  smoke = Config.from_dict(uci_config.get_config("smoke"))
  assert smoke.replace(num_steps=5000, plateau_patience=50,
                       early_stopping_patience=100) == base
  assert (smoke.num_steps, smoke.plateau_patience, smoke.early_stopping_patience) == (30, 5, 10)
  _harness.check_fixed(base, uci.UCI.per_run_keys, "E3", uci.UCI.required)
  plan, missing, _ = uci.runs(base, ["boston"], ["sp", "gmp"], 1, "honest", 0.1)
  assert not missing and [r.name for r in plan] == ["dataset=boston/variant=sp/split=0",
                                                    "dataset=boston/variant=gmp/split=0"]
  sp, gmp = (r.config for r in plan)
  assert (sp.model["variant"], sp.learning_rate, gmp.model["variant"], gmp.learning_rate) == (
      "sp", 0.01, "gmp", 0.1)
  assert sp.data == {"name": "uci/boston", "csv_path": "", "download": True, "data_dir": "",
                     "split_index": 0, "validation_fraction": 0.2}
  assert (sp.mesh.data, sp.mesh.fsdp, sp.mesh.model) == (1, 1, 1)
  assert sp.batch_size == 324 and sp.final_eval_splits == ("test",)   # 506 − 101 − 81
  for config in (sp, gmp):
    program.check(config, devices=jax.devices()[:1])   # built as the run will be


def test_smoke_flagfile_runs_and_reports_beside_the_paper(tmp_path):
  workdir = tmp_path / "uci"
  proc = _cli.run("uci", "--flagfile=experiments/flags/uci_smoke.flags", f"--workdir={workdir}")
  results = json.loads((workdir / "results.json").read_text())
  rows = {(r["setting"]["dataset"], r["setting"]["variant"]): r for r in results["rows"]}
  assert set(rows) == {("boston", "sp"), ("boston", "gmp")}
  for (dataset, variant), row in rows.items():
    assert row["paper"] == uci.PAPER[dataset][uci.VARIANTS.index(variant)]
    assert row["n"] == 2 and len(row["ours"]) == 2
    # RMSE in original units (thousands of dollars): a trained net is far better than
    # predicting the mean (target std ≈ 9.2) and not absurdly good.
    assert all(1.0 < v < 9.0 for v in row["ours"]), row["ours"]
  report = (workdir / "report.md").read_text()
  assert "| boston | gmp | test RMSE | 3.057 |" in report
  assert (workdir / "uci_rmse.png").stat().st_size > 1000
  assert "Report: " in proc.stdout and "Plot: " in proc.stdout
  # Each run's own record, with the test split evaluated at the best state.
  record = json.loads((workdir / "runs/dataset=boston/variant=gmp/split=1/result.json")
                      .read_text())
  assert record["test"]["examples"] == 101 and math.isfinite(record["test"]["rmse"])
  # The report links its plot relative to the workdir (it renders wherever the workdir is).
  assert "![uci_rmse.png](uci_rmse.png)" in report and str(workdir) not in report
  # Rerunning continues the experiment: finished runs are read back, same report —
  # with the first sitting's wall time, not the second's few seconds.
  wall = results["seconds"]
  again = _cli.run("uci", "--flagfile=experiments/flags/uci_smoke.flags", f"--workdir={workdir}")
  assert again.stdout.count("done earlier") == 4
  rerun = json.loads((workdir / "results.json").read_text())
  assert rerun["rows"] == results["rows"]
  assert rerun["seconds"] == wall and f"wall time {wall:.0f} s." in (workdir / "report.md"
                                                                    ).read_text()
  # A resumed experiment (one run left to train) counts both sittings.
  (workdir / "runs/dataset=boston/variant=sp/split=1/result.json").unlink()
  resumed = _cli.run("uci", "--flagfile=experiments/flags/uci_smoke.flags",
                     f"--workdir={workdir}")
  assert resumed.stdout.count("done earlier") == 3
  sittings = json.loads((workdir / "wall_time.json").read_text())
  assert len(sittings) == 2 and wall in sittings.values()
  total = json.loads((workdir / "results.json").read_text())["seconds"]
  assert total == pytest.approx(sum(sittings.values())) and total > wall


def test_reruns_are_bit_identical_whatever_the_threads(tmp_path):
  """WN and BN (norms and batch statistics: reductions) give the same bits twice,
  the second time on one CPU (another XLA thread-pool size). Each run compiles its own
  programs (no shared compilation cache)."""
  import os
  one_cpu = {"preexec_fn": lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})}
  records = []
  for name, kwargs in (("a", {}), ("b", one_cpu)):
    workdir = tmp_path / name
    _cli.run("uci", "--flagfile=experiments/flags/uci_smoke.flags", "--variants=wn,bn",
             "--num_splits=1", f"--workdir={workdir}", shared_cache=False, **kwargs)
    records.append({v: json.loads((workdir / f"runs/dataset=boston/variant={v}/split=0/"
                                             "result.json").read_text()) for v in ("wn", "bn")})
  for variant in ("wn", "bn"):
    a, b = (r[variant] for r in records)
    assert (a["final_step"], a["test"], a["eval"], a["best"]) == (
        b["final_step"], b["test"], b["eval"], b["best"]), variant


@pytest.mark.parametrize("flag, message", [
    ("--uci_datasets=boston,mars", "--uci_datasets=boston,mars: unknown 'mars'"),
    ("--variants=sp,gmp2", "--variants=sp,gmp2: unknown 'gmp2'"),
    ("--num_splits=11", "--num_splits=11: 11 is not an integer in the range [1, 10]"),
    ("--protocol=leaky", "--protocol=leaky: value should be one of <honest|released>"),
    ("--config.optimizer.euclidean.learning_rate=0",
     "config.optimizer.euclidean.learning_rate=0.0: must be > 0"),
    ("--gmp_lr=-1", "--gmp_lr=-1.0: must be > 0"),
])
def test_bad_flags_fail_fast_with_one_line(tmp_path, flag, message):
  proc = _cli.forked("uci", "--flagfile=experiments/flags/uci_smoke.flags",
                  f"--workdir={tmp_path}", flag)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {message}")
  assert not (tmp_path / "runs").exists()
