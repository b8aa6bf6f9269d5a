"""The plotting functions write non-empty files; the reported ρ is numpy's."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from orthojax import analysis as oa


def _bands(epochs, start, drift):
  return [{"epoch": e, "sv_mean": start + drift * e, "sv_std": 0.1 + 0.01 * e,
           "sv_min": start - 0.5, "sv_max": start + 0.5 + drift * e} for e in epochs]


def test_singular_value_bands(tmp_path):
  records = {"orthogonal": _bands(range(6), 1.0, 0.0),
             "glorot": {"epoch": [0, 1, 2], "cell/kernel/sv_mean": [0.8, 0.9, 1.0],
                        "cell/kernel/sv_std": [0.3, 0.3, 0.3], "cell/kernel/sv_min": [0.1] * 3,
                        "cell/kernel/sv_max": [2.0] * 3}}
  with pytest.raises(ValueError, match="lacks"):
    oa.plot_singular_value_bands(records, tmp_path / "bands.png")   # mixed key styles
  records["glorot"] = _bands(range(3), 0.8, 0.1)
  path = oa.plot_singular_value_bands(records, tmp_path / "sub" / "bands.png", title="RNN")
  assert path.endswith("bands.png") and (tmp_path / "sub" / "bands.png").stat().st_size > 1000
  # keys as logged by spectrum_stats / spectrum_hook: "<leaf>/sv_mean", ...
  logged = {"v": [{"step": s, **{f"cell/kernel/{k}": v for k, v in r.items() if k != "epoch"}}
                  for s, r in zip((10, 20), _bands(range(2), 1.0, 0.0))]}
  logged["v"].insert(1, {"step": 15, "split": "train", "loss": 0.3})   # other log lines
  path = oa.plot_singular_value_bands(logged, tmp_path / "logged.pdf", leaf="cell/kernel",
                                      x_key="step")
  assert (tmp_path / "logged.pdf").stat().st_size > 1000
  with pytest.raises(ValueError, match="empty"):
    oa.plot_singular_value_bands({}, tmp_path / "x.png")


def test_jacobian_spectrum(tmp_path):
  s = np.sqrt(np.random.default_rng(0).chisquare(4, size=400) / 4)
  moments = oa.jacobian_spectrum_moments("relu", 3, weights="orthogonal", sigma_w=np.sqrt(2),
                                         q_star=1.0)
  for name, theory in (("moments", moments), ("mapping", {"m1": 1.0, "variance": 0.5}),
                       ("density", lambda t: np.exp(-t)), ("none", None)):
    path = oa.plot_jacobian_spectrum(s, tmp_path / f"{name}.png", theory=theory)
    assert (tmp_path / f"{name}.png").stat().st_size > 1000 and path.endswith(f"{name}.png")
  with pytest.raises(TypeError, match="theory"):
    oa.plot_jacobian_spectrum(s, tmp_path / "bad.png", theory={"mean": 1.0})
  with pytest.raises(ValueError, match="squared=True"):
    oa.plot_jacobian_spectrum(s, tmp_path / "bad.png", theory=moments, squared=False)
  with pytest.raises(ValueError, match="no finite"):
    oa.plot_jacobian_spectrum([np.nan], tmp_path / "bad.png")


def test_fisher_vs_jacobian_reports_numpys_pearson(tmp_path):
  rng = np.random.default_rng(1)
  sigma = rng.uniform(0.5, 3.0, 20)
  lam = 2.0 * sigma**2 + rng.normal(0, 1.0, 20)
  path, rho = oa.plot_fisher_vs_jacobian(lam, sigma, tmp_path / "fim.png",
                                         groups=["a", "b"] * 10, log=True)
  assert (tmp_path / "fim.png").stat().st_size > 1000 and path.endswith("fim.png")
  assert rho == pytest.approx(np.corrcoef(sigma**2, lam)[0, 1], rel=1e-12)
  assert rho > 0.8                                     # against σ², not σ
  assert oa.pearson(sigma, -sigma) == pytest.approx(-1.0)
  with pytest.raises(ValueError, match="differ"):
    oa.plot_fisher_vs_jacobian(lam[:3], sigma, tmp_path / "x.png")
  with pytest.raises(ValueError, match="at least 2"):
    oa.plot_fisher_vs_jacobian(lam[:1], sigma[:1], tmp_path / "x.png")
  with pytest.raises(ValueError, match="groups"):
    oa.plot_fisher_vs_jacobian(lam, sigma, tmp_path / "x.png", groups=["a"])


def test_matplotlib_is_loaded_lazily_without_pyplot(tmp_path):
  """In a fresh interpreter: importing orthojax.analysis loads neither matplotlib nor
  the training stack, and plotting draws on the Agg canvas without pyplot."""
  code = (
      "import sys, orthojax.analysis as oa\n"
      "assert not any(m.startswith('matplotlib') for m in sys.modules)\n"
      "assert not any(m.startswith(('orthojax.train', 'tensorflow', 'experiments'))"
      " for m in sys.modules)\n"
      f"oa.plot_fisher_vs_jacobian([1.0, 2.0], [1.0, 1.5], {str(tmp_path / 'f.png')!r})\n"
      "assert 'matplotlib' in sys.modules and 'matplotlib.pyplot' not in sys.modules\n")
  subprocess.run([sys.executable, "-c", code], check=True)
  assert (tmp_path / "f.png").stat().st_size > 1000


@pytest.mark.parametrize("rho, n", [(0.0, 200), (0.6, 200), (0.9, 400)])
def test_pearson_interval_agrees_with_fishers_z_interval(rho, n):
  """For bivariate normal pairs the BCa bootstrap interval of ρ and Fisher's
  ``tanh(atanh(r) ± z/√(n − 3))`` are both ≈ 95 % intervals: they agree closely."""
  rng = np.random.default_rng(7)
  x = rng.normal(size=n)
  y = rho * x + math.sqrt(1 - rho ** 2) * rng.normal(size=n)
  r = oa.pearson(x, y)
  low, high = oa.pearson_interval(x, y)
  half = 1.959964 / math.sqrt(n - 3)
  assert low < r < high
  assert low == pytest.approx(math.tanh(math.atanh(r) - half), abs=0.03)
  assert high == pytest.approx(math.tanh(math.atanh(r) + half), abs=0.03)
  assert oa.pearson_interval(x, y) == (low, high)            # deterministic for a seed
  narrow = oa.pearson_interval(x, y, confidence=0.5)
  assert low < narrow[0] < r < narrow[1] < high


def test_pearson_interval_rejects_bad_input():
  with pytest.raises(ValueError, match="at least 3 pairs"):
    oa.pearson_interval([1.0, 2.0], [1.0, 3.0])
  with pytest.raises(ValueError, match="differ in length"):
    oa.pearson_interval([1.0, 2.0, 3.0], [1.0, 3.0])
  with pytest.raises(ValueError, match=r"confidence=1.5 must be in \(0, 1\)"):
    oa.pearson_interval([1.0, 2.0, 3.0], [1.0, 3.0, 2.0], confidence=1.5)
  assert all(math.isnan(v) for v in oa.pearson_interval([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))


def test_fisher_scatter_wraps_its_title_and_labels_log_ticks_plainly(tmp_path, monkeypatch):
  from orthojax.analysis import _plots
  figures = []
  monkeypatch.setattr(_plots, "_save", lambda fig, path: figures.append(fig) or str(path))
  lam, sigma = np.array([3.0, 3.2, 17.0, 29.0, 9.0]), np.sqrt([1.2, 1.25, 4.0, 4.0, 2.0])
  title = "E5 mnist, depth 200: at initialisation, cross entropy, sixty networks of four kinds"
  _, rho = oa.plot_fisher_vs_jacobian(lam, sigma, tmp_path / "f.png", title=title, log=True)
  (fig,) = figures
  fig.canvas.draw()
  (ax,) = fig.axes
  lines = ax.get_title().splitlines()
  assert " ".join(lines[:-1]) == title and all(len(line) <= 56 for line in lines)
  assert lines[-1] == f"Pearson ρ = {rho:.3f} over 5 points"
  labels = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True)]
  assert "10" in labels and not any("times" in t or "^" in t for t in labels)
