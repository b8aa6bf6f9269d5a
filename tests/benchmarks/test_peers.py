"""The peers suite without the peers installed (as in CI): orthojax's split of its whole
step, and one row saying why the rest is skipped; every row names the CPU."""

from __future__ import annotations

import importlib.util
import math

import pytest

from benchmarks import _harness
from benchmarks import peers_bench


def test_without_the_peers_the_suite_says_it_is_skipped_and_why(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name in peers_bench.PEERS else real(name, *a))
  *split, only = peers_bench.run(quick=True)
  assert only.case == "skipped" and math.isnan(only.value) and only.status == "report-only"
  assert only.note.startswith('torch, geoopt, geotorch not installed: pip install -e ".[peers]"')
  model = _harness.device_description()["cpu_model"]
  assert all(r.note.endswith(model) for r in [*split, only])
  parts = {r.case.rsplit(": ", 1)[1]: r.value for r in split if "radam_qr" in r.case}
  assert set(parts) == {"forward+backward", "forward+backward, scanned", "update", "step",
                        "the rest"}
  assert parts["the rest"] == pytest.approx(
      parts["step"] - parts["forward+backward"] - parts["update"])


@pytest.mark.skipif(bool(peers_bench.missing_peers()), reason="the peers extra is not installed")
def test_the_quick_suite_compares_like_with_like():
  rows = {r.case: r for r in peers_bench.run(quick=True)}
  ratios = [r for case, r in rows.items() if case.endswith(" / geoopt") and "step," in case
            and "train" not in case]
  assert len(ratios) == 5   # radam QR and rsgd QR both ways, Cayley
  assert all(r.value > 0 and r.target == "<= 0.8 (cpu)" for r in ratios)
