"""Workdirs on a cloud bucket (gs://): metrics, run records, reports and plots go there.

``etils.epath`` is mocked so that ``gs://bucket/...`` lives in a temporary
directory; code that used ``open``/``os`` directly would instead create a
local directory named ``gs:`` — the test checks that none appears.
"""

from __future__ import annotations

import contextlib
import os
from unittest import mock

import pytest
from etils import epath
from etils.epath import gpath

from experiments import _harness
from orthojax.train import metrics


@contextlib.contextmanager
def fake_bucket(root):
  def local(path):
    text = os.fspath(path)
    return str(root / text[len("gs://"):]) if text.startswith("gs://") else text

  one = lambda fn, path, *a, **k: fn(local(path), *a, **k)
  two = lambda fn, src, dst, *a, **k: fn(local(src), local(dst), *a, **k)
  # With TensorFlow installed epath sends gs:// to tf.io.gfile before its
  # (mockable) backend table; pretend TF is absent so the mock applies.
  with mock.patch.object(gpath, "_is_tf_installed", lambda: False), \
       epath.testing.mock_epath(exists=one, isdir=one, makedirs=one, mkdir=one, open=one,
                                remove=one, rmtree=one, stat=one, glob=one, listdir=one,
                                rename=two, replace=two, copy=two):
    yield


def test_metrics_records_report_and_plots_land_in_the_bucket(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  bucket = tmp_path / "store"
  with fake_bucket(bucket):
    writer = metrics.MetricsWriter("gs://b/run", total_steps=2, tensorboard=False,
                                   is_writer=True, print_fn=lambda line: None)
    writer.write(1, {"loss": 2.0})
    writer.write(2, {"loss": 1.0})
    writer.close()
    assert [r["loss"] for r in metrics.read_jsonl("gs://b/run/metrics.jsonl")] == [2.0, 1.0]

    _harness.write_json("gs://b/run/runs/x=1/result.json", {"final_step": 2})
    rows = [_harness.Row({"variant": "gmp"}, "test RMSE", [3.0, 3.2], 3.057)]
    plot = _harness.plot_rows(rows, "gs://b/run/plot.png", group="variant", series="variant")
    scatter = "gs://b/run/scatter.png"   # rendered locally, then copied to the bucket
    _harness.local_render(scatter, lambda p: _harness.plot_rows(rows, p, group="variant",
                                                                series="variant"))
    _harness.write_report("gs://b/run", experiment="uci", title="E3", rows=rows,
                          plots=[plot, scatter], print_fn=lambda line: None)
    results = _harness.read_results("gs://b/run")
  assert results["rows"][0]["paper"] == 3.057
  assert results["plots"] == ["gs://b/run/plot.png", "gs://b/run/scatter.png"]
  for name in ("run/metrics.jsonl", "run/runs/x=1/result.json", "run/report.md",
               "run/results.json"):
    assert (bucket / "b" / name).stat().st_size > 0, name
  for name in ("run/plot.png", "run/scatter.png"):
    assert (bucket / "b" / name).read_bytes()[:4] == b"\x89PNG"
  assert not any(p.name.startswith("gs:") for p in tmp_path.rglob("*"))
  assert not (bucket / "b" / "run" / "runs" / "x=1" / "result.json.tmp").exists()


def test_missing_results_name_the_bucket_path(tmp_path):
  with fake_bucket(tmp_path), pytest.raises(FileNotFoundError, match="gs://b/none/results.json"):
    _harness.read_results("gs://b/none")
