"""The experiment harness's rows and reports, and the report merger, on fixture results."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from experiments import _harness
from experiments._harness import runs
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
  assert "| boston | gmp | test RMSE | 3.057 | 3.100 ± 0.141 | 2 | 0.043 |" in table[2]
  assert "| yacht | sp | test RMSE | — | 0.7000 | 1 | — |" in table[3]


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
  assert "| honest | gmp | test RMSE | 3.057 | 3.200 ± 0.283 | 2 |" in merged
  assert "| released | gmp | test RMSE | 3.057 | 2.900 | 1 |" in merged
  assert "| 8 | orthogonal | epochs | — | 13.00 ± 1.41 | 2 |" in merged
  assert "- released: protocol: released" in merged


def test_merge_links_plots_relative_to_where_the_markdown_is_read(tmp_path):
  """Plots are linked from the merged markdown's directory, also after the workdir moved."""
  old = tmp_path / "old" / "uci"
  _fixture(old, "uci", "E3 UCI", [_harness.Row({"variant": "gmp"}, "RMSE", [3.0])])
  results = json.loads((old / "results.json").read_text())
  results["plots"] = [str(old / "uci.png"), "/elsewhere/shared.png"]
  (old / "results.json").write_text(json.dumps(results))
  (old / "uci.png").write_bytes(b"png")
  merged = report.merge([str(old)], base=str(tmp_path))
  assert "- plot: old/uci/uci.png" in merged
  assert "- plot: /elsewhere/shared.png" in merged            # not in the workdir: as recorded
  moved = tmp_path / "new" / "uci"
  os.makedirs(moved.parent)
  os.rename(old, moved)
  merged = report.merge([str(moved)], base=str(tmp_path / "new"))
  assert "- plot: uci/uci.png" in merged


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


@pytest.mark.parametrize("values, expected", [
    ((3.7042, 0.8881, 3.37, 0.3342), ["3.704", "0.888", "3.370", "0.334"]),  # 4 digits of the largest
    ((0.1, 73.63), ["0.10", "73.63"]),                     # a row's numbers: same decimals
    ((12345.6, 30.2), ["12346", "30"]),
    ((1.37e6, 2e5), ["1.370e+06", "2.000e+05"]),           # outside [1e-3, 1e6): scientific
    ((-0.0001, 3.0), ["0.000", "3.000"]),                  # no "-0.000"
    ((float("nan"), None), ["—", "—"]),
])
def test_number_format_gives_a_row_one_decimal_place(values, expected):
  fmt = _harness.number_format(*values[:2])
  assert [fmt(v) for v in values] == expected


def test_bar_figure_labels_the_axis_and_tells_ours_from_the_paper():
  import matplotlib.colors as mcolors
  rows = [_harness.Row({"dataset": "boston", "variant": v}, "test RMSE", [3.0, 3.4], p)
          for v, p in (("sp", 3.37), ("gmp", None))]
  fig = _harness.bar_figure(rows, group="dataset", series="variant", ylabel="test RMSE (units)")
  ax = fig.axes[0]
  assert ax.get_ylabel() == "test RMSE (units)"
  bars = [c for c in ax.containers if hasattr(c, "errorbar")]
  assert len(bars) == 2
  for container in bars:
    _, caps, (stem,) = container.errorbar.lines
    assert len(caps) == 2   # capped
    assert mcolors.to_hex(stem.get_color()[0]) == "#000000"
    assert all(mcolors.to_hex(c.get_markeredgecolor()) == "#000000" for c in caps)
  paper = [line for line in ax.get_lines() if line.get_label() == "paper"]
  assert len(paper) == 1 and paper[0].get_marker() == "D"   # only the row that has one
  assert mcolors.to_hex(paper[0].get_markeredgecolor()) != "#000000"
  assert paper[0].get_markerfacecolor() == "white"
  (legend,) = fig.legends   # one legend for all panels, under them
  assert sorted(t.get_text() for t in legend.get_texts()) == [
      "ours (mean ± std of 2 runs)", "paper"]
  assert ax.get_ylim()[0] == 0 and 3.2 + 0.283 < ax.get_ylim()[1]   # from 0; mean + std shown
  assert ax.get_title() == "dataset boston: test RMSE"
  import matplotlib.pyplot as plt
  plt.close(fig)


@pytest.mark.parametrize("values,paper,top", [
    ([0.0], None, 1.0),          # all zero: a flat 0 on [0, 1], not noise on ±0.04
    ([10.0], 73.63, 73.63),      # the paper's diamond above the bar stays on the axis
])
def test_bar_figure_axis_starts_at_zero_and_shows_every_value(values, paper, top):
  fig = _harness.bar_figure([_harness.Row({"model": "m", "variant": "bn"}, "top-1 (%)", values,
                                          paper)], group="model", series="variant",
                            paper_label="paper, another setting (a target only)")
  low, high = fig.axes[0].get_ylim()
  assert low == 0 and top <= high <= 1.12 * top + 1e-9
  labels = sorted(t.get_text() for t in fig.legends[0].get_texts())
  assert labels == (["ours (one run)", "paper, another setting (a target only)"] if paper
                    else ["ours (one run)"])
  import matplotlib.pyplot as plt
  plt.close(fig)
  import matplotlib.pyplot as plt
  plt.close(fig)


def test_report_shows_plots_relative_to_the_workdir(tmp_path):
  workdir = tmp_path / "uci"
  workdir.mkdir()
  plot = _harness.plot_rows([_harness.Row({"v": "sp"}, "m", [1.0, 2.0], 1.5)],
                            str(workdir / "plots" / "bars.png"), group="v", series="v")
  markdown = _harness.write_report(str(workdir), experiment="x", title="X", rows=[],
                                   plots=[plot], print_fn=lambda line: None)
  assert "![bars.png](plots/bars.png)" in markdown
  assert str(tmp_path) not in markdown
  moved = tmp_path / "elsewhere"
  os.rename(workdir, moved)   # the report's links still resolve
  assert (moved / "plots/bars.png").exists()
  assert json.loads((moved / "results.json").read_text())["plots"] == [plot]   # full path
  assert _harness.relative_to("gs://b/run/p.png", "gs://b/run") == "p.png"
  assert _harness.relative_to("gs://b/other/p.png", "gs://b/run") == "gs://b/other/p.png"
  assert _harness.relative_to("/data/p.png", str(workdir)) == "/data/p.png"


def test_wall_time_sums_the_sittings_that_trained(tmp_path, monkeypatch):
  sitting = runs.Sitting()
  monkeypatch.setattr(runs, "SITTING", sitting)
  workdir = str(tmp_path)
  quiet = dict(experiment="x", title="X", rows=[], print_fn=lambda line: None)

  def report(seconds, trained):
    sitting.reset()
    sitting.id += f"-{len(runs.read_sittings(workdir))}"   # one process, several sittings
    sitting.trained = trained
    markdown = _harness.write_report(workdir, seconds=seconds, **quiet)
    return json.loads((tmp_path / "results.json").read_text())["seconds"], markdown

  assert report(100.0, trained=True)[0] == 100.0
  seconds, markdown = report(1.0, trained=False)    # a rerun that reads finished runs back
  assert seconds == 100.0 and "wall time 100 s." in markdown
  assert report(50.0, trained=True)[0] == 150.0      # a resumed experiment: every sitting
  assert len(json.loads((tmp_path / "wall_time.json").read_text())) == 2
