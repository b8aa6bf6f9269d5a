"""The experiment harness's rows and reports, and the report merger, on fixture results."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from experiments import _harness
from experiments import report
from tests.experiments import _cli


def test_row_stats_match_numpy_and_skip_non_finite():
  values = [3.1, 2.7, 3.6, float("nan")]
  row = _harness.Row({"dataset": "boston"}, "test RMSE", values, paper=3.0)
  mean, std, n = row.stats()
  finite = np.array(values[:3])
  assert n == 3
  assert mean == pytest.approx(finite.mean())
  assert std == pytest.approx(finite.std(ddof=1))
  assert _harness.Row({}, "m", []).stats()[2] == 0


def test_markdown_table_puts_paper_beside_ours():
  rows = [_harness.Row({"dataset": "boston", "variant": "gmp"}, "test RMSE", [3.0, 3.2], 3.057),
          _harness.Row({"dataset": "yacht", "variant": "sp"}, "test RMSE", [0.7], None)]
  table = _harness.markdown_table(rows).splitlines()
  assert table[0].startswith("| dataset | variant | metric | paper | ours (mean ± std) | n |")
  assert "| boston | gmp | test RMSE | 3.057 | 3.1 ± 0.1414 | 2 | 0.043 |" in table[2]
  assert "| yacht | sp | test RMSE | — | 0.7 | 1 | — |" in table[3]


def _fixture(workdir, experiment, title, rows, notes=()):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump({"experiment": experiment, "title": title,
               "rows": [r.to_json() for r in rows], "notes": list(notes), "plots": []}, f)


def test_merge_groups_by_experiment_and_labels_repeated_runs(tmp_path):
  row = lambda v, paper: _harness.Row({"variant": "gmp"}, "test RMSE", v, paper)
  _fixture(tmp_path / "honest", "uci", "E3 UCI", [row([3.0, 3.4], 3.057)], ["protocol: honest"])
  _fixture(tmp_path / "released", "uci", "E3 UCI", [row([2.9], 3.057)], ["protocol: released"])
  _fixture(tmp_path / "linear", "deep_linear", "E7 deep linear",
           [_harness.Row({"depth": 8, "init": "orthogonal"}, "epochs", [12.0, 14.0])])
  merged = report.merge([str(tmp_path / d) for d in ("honest", "linear", "released")])
  assert merged.index("## E3 UCI") < merged.index("## E7 deep linear")
  assert "| honest | gmp | test RMSE | 3.057 | 3.2 ± 0.2828 | 2 |" in merged
  assert "| released | gmp | test RMSE | 3.057 | 2.9 | 1 |" in merged
  assert "| 8 | orthogonal | epochs | — | 13 ± 1.414 | 2 |" in merged
  assert "- released: protocol: released" in merged


def test_merge_cli_errors_name_the_missing_results(tmp_path):
  proc = _cli.run("report", str(tmp_path / "nothing"), check=False)
  assert proc.returncode == 2
  assert f"{tmp_path / 'nothing'}/results.json: no results" in proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1
  proc = _cli.run("report", check=False)
  assert proc.returncode == 2 and "no workdirs given" in proc.stderr


def test_final_split_record_keys_never_shadow_the_run_metrics():
  from experiments._harness import split_record_key
  assert split_record_key("test") == "test"
  assert split_record_key("validation") == "validation"
  assert split_record_key("train") == "train_split"  # record["train"]: logged train metrics
  assert split_record_key("eval") == "eval_split"
