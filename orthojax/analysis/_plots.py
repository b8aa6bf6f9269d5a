r"""Figures for the spectral diagnostics: singular-value bands, Jacobian spectra, λ_max vs σ_max².

Matplotlib is imported lazily, inside each function, and figures are drawn
on the Agg canvas directly (``matplotlib.figure.Figure`` +
``FigureCanvasAgg``): no pyplot, no global backend switch, no display
needed. Every function writes the figure to ``path`` (its format from the
suffix: ``.png``, ``.pdf``, ``.svg``; parent directories are created) and
returns the path.

References:
  Ester Hlav, "Dynamic isometry as a consequence of weight orthogonality
  for faster and better convergence" (Columbia University), Figure 7
  (recurrent kernel singular values during training, mean ± std band).
  Pennington, Schoenholz & Ganguli, NeurIPS 2017 (Jacobian spectra).
  Sokol & Park, ICLR 2020 (Figure 2: λ_max(FIM) against σ_max²(J),
  Pearson ρ).
"""

from __future__ import annotations

import math
import os
import textwrap
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from orthojax.analysis._spectrum import SV_STATS


def _figure(figsize):
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=figsize, layout="constrained")
  FigureCanvasAgg(fig)
  return fig


def _save(fig, path) -> str:
  path = os.fspath(path)
  folder = os.path.dirname(path)
  if folder:
    os.makedirs(folder, exist_ok=True)
  fig.savefig(path, dpi=120)
  return path


def _columns(rows: Any, keys: Sequence[str], variant: str) -> dict[str, np.ndarray]:
  """``{key: 1-D array}`` from a list of record dicts or a dict of sequences."""
  if isinstance(rows, Mapping):
    available = list(rows)
    get = lambda k: np.asarray(rows[k], dtype=np.float64).reshape(-1)
  else:
    rows = list(rows)
    if not rows:
      raise ValueError(f"records[{variant!r}] is empty")
    available = sorted({k for r in rows for k in r})
    # A metrics log mixes kinds of lines (train, eval, spectrum): keep the rows
    # holding every key asked for.
    rows = [r for r in rows if all(k in r for k in keys)]
    get = lambda k: np.asarray([r[k] for r in rows], dtype=np.float64)
  missing = [k for k in keys if k not in available]
  if missing or (not isinstance(rows, Mapping) and not rows):
    raise ValueError(f"records[{variant!r}] lacks {missing or 'rows with all of ' + str(keys)}; "
                     f"available keys: {available[:20]}" + (" ..." if len(available) > 20 else ""))
  cols = {k: get(k) for k in keys}
  lengths = {len(v) for v in cols.values()}
  if len(lengths) != 1:
    raise ValueError(f"records[{variant!r}]: columns {list(keys)} have different lengths "
                     f"{[len(cols[k]) for k in keys]}")
  return cols


def plot_singular_value_bands(records: Mapping[str, Any], path: str | os.PathLike, *,
                              leaf: str | None = None, x_key: str = "epoch",
                              title: str | None = None, ncols: int | None = None,
                              ylabel: str = "singular value", sharey: bool = True) -> str:
  r"""Singular values over training, one panel per variant (Hlav's Figure 7 style).

  Each panel shows the mean singular value as a line, the band
  ``mean ± std`` shaded, and the minimum and maximum as dashed lines,
  against ``x_key`` (epoch or step).

  Args:
    records: ``{variant: rows}``; ``rows`` is a list of record dicts (e.g.
      the trainer's metrics-log lines; rows lacking a needed key, such as
      train or eval lines, are skipped) or a dict of equal-length sequences,
      holding
      ``x_key`` and ``sv_mean``, ``sv_std``, ``sv_min``, ``sv_max`` — or
      ``"<leaf>/sv_mean"`` … when ``leaf`` is given (the keys of
      :func:`~orthojax.analysis.spectrum_stats`).
    path: output file.
    leaf: the parameter path prefix of the statistics, e.g.
      ``"cell/recurrent/kernel"``.
    x_key: the x-axis key.
    title: figure title.
    ncols: panels per row (default: all in one row, at most 4).
    ylabel: y-axis label.
    sharey: share the y axis across panels.

  Returns:
    ``path`` as a string.

  Raises:
    ValueError: no variants, or a variant lacks a required key.
  """
  if not records:
    raise ValueError("plot_singular_value_bands: records is empty")
  stat_keys = [f"{leaf}/{s}" if leaf else s for s in SV_STATS]
  data = {name: _columns(rows, [x_key] + stat_keys, name) for name, rows in records.items()}
  n = len(data)
  ncols = min(n, 4) if ncols is None else max(1, int(ncols))
  nrows = math.ceil(n / ncols)
  fig = _figure((3.6 * ncols, 2.8 * nrows))
  axes = np.atleast_1d(fig.subplots(nrows, ncols, sharey=sharey, squeeze=False)).reshape(-1)
  for ax, (name, cols) in zip(axes, data.items()):
    order = np.argsort(cols[x_key], kind="stable")
    x = cols[x_key][order]
    mean, std, lo, hi = (cols[k][order] for k in stat_keys)
    ax.fill_between(x, mean - std, mean + std, alpha=0.3, color="C0", label="mean ± std of the singular values")
    ax.plot(x, mean, color="C0", lw=1.5, label="mean")
    ax.plot(x, lo, color="C1", lw=1.0, ls="--", label="min")
    ax.plot(x, hi, color="C3", lw=1.0, ls="--", label="max")
    ax.set_title(str(name), fontsize=9)
    ax.set_xlabel(x_key)
    if np.all(x == np.round(x)):   # epochs, steps: whole numbers on the axis
      ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
  for ax in axes[n:]:
    ax.set_visible(False)
  axes[0].set_ylabel(ylabel)
  fig.legend(*axes[0].get_legend_handles_labels(), fontsize=8, ncols=4,
             loc="outside lower center")   # under the panels, over no data
  if title:
    fig.suptitle(title)
  return _save(fig, path)


def plot_jacobian_spectrum(singular_values: Any, path: str | os.PathLike, *,
                           theory: Any = None, bins: int = 50, squared: bool = True,
                           title: str | None = None, label: str | None = None) -> str:
  r"""Histogram of (squared) Jacobian singular values beside the theory.

  Args:
    singular_values: any array of singular values ``s`` (flattened; e.g. a
      :class:`~orthojax.analysis.JacobianSpectrum` ``.largest`` of the exact
      method, all values of all examples).
    path: output file.
    theory: what to draw over the histogram: None; a callable density
      ``ρ(t)`` on the x-axis variable (drawn as a curve); or predicted
      moments — a :class:`~orthojax.analysis.JacobianMoments` or a mapping
      with ``"m1"`` and ``"variance"`` (of ``s²``) — drawn as a vertical
      line at ``m1`` and a band ``m1 ± σ``, with the empirical moments in the
      legend (moments apply with ``squared=True``).
    bins: histogram bins.
    squared: histogram of ``s²`` (eigenvalues of ``JJᵀ``, default) or ``s``.
    title: figure title.
    label: legend label of the histogram.

  Returns:
    ``path`` as a string.

  Raises:
    ValueError: no finite values; moments given with ``squared=False``.
    TypeError: an unsupported ``theory``.
  """
  s = np.asarray(singular_values, dtype=np.float64).reshape(-1)
  s = s[np.isfinite(s)]
  if s.size == 0:
    raise ValueError("plot_jacobian_spectrum: no finite singular values")
  v = s * s if squared else s
  var = "s²" if squared else "s"
  fig = _figure((5.0, 3.6))
  ax = fig.add_subplot()
  ax.hist(v, bins=bins, density=True, alpha=0.6, color="C0",
          label=(label or "empirical") + f" (mean {v.mean():.3g}, var {v.var():.3g})")
  if theory is not None:
    if callable(theory) and not isinstance(theory, Mapping) and not hasattr(theory, "_fields"):
      t = np.linspace(v.min(), v.max(), 400)
      ax.plot(t, np.asarray(theory(t), dtype=np.float64), color="C3", lw=1.5, label="theory")
    else:
      if hasattr(theory, "_asdict"):
        theory = theory._asdict()
      if not isinstance(theory, Mapping) or "m1" not in theory or "variance" not in theory:
        raise TypeError("plot_jacobian_spectrum: theory must be a callable density, a "
                        "JacobianMoments, or a mapping with 'm1' and 'variance'")
      if not squared:
        raise ValueError("plot_jacobian_spectrum: predicted moments are of s²; use squared=True")
      m1, sd = float(theory["m1"]), math.sqrt(max(float(theory["variance"]), 0.0))
      ax.axvline(m1, color="C3", lw=1.5, label=f"theory mean {m1:.3g}, var {sd * sd:.3g}")
      ax.axvspan(m1 - sd, m1 + sd, color="C3", alpha=0.12)
  ax.set_xlabel(var)
  ax.set_ylabel("density")
  ax.legend(fontsize=7)
  if title:
    ax.set_title(title)
  return _save(fig, path)


def _pairs(x: Any, y: Any, who: str, minimum: int) -> tuple[np.ndarray, np.ndarray]:
  """Two equal-length float64 samples of at least ``minimum`` pairs (else ValueError)."""
  x = np.asarray(x, dtype=np.float64).reshape(-1)
  y = np.asarray(y, dtype=np.float64).reshape(-1)
  if x.shape != y.shape:
    raise ValueError(f"{who}: samples differ in length ({x.size} vs {y.size})")
  if x.size < minimum:
    raise ValueError(f"{who}: needs at least {minimum} pairs")
  return x, y


def pearson(x: Any, y: Any) -> float:
  r"""Pearson's ``ρ = cov(x, y) / (σ_x σ_y)`` of two equal-length samples.

  Raises:
    ValueError: different lengths or fewer than 2 pairs.
  """
  x, y = _pairs(x, y, "pearson", 2)
  xc, yc = x - x.mean(), y - y.mean()
  denom = math.sqrt(float(np.sum(xc * xc)) * float(np.sum(yc * yc)))
  return float(np.sum(xc * yc) / denom) if denom > 0 else float("nan")


def pearson_interval(x: Any, y: Any, *, confidence: float = 0.95, n_resamples: int = 9999,
                     seed: int = 0) -> tuple[float, float]:
  r"""Bootstrap confidence interval of Pearson's ``ρ`` over the pairs ``(x_i, y_i)``.

  The pairs are resampled together (``scipy.stats.bootstrap`` with
  ``paired=True``) and the interval is the bias-corrected and accelerated
  (BCa) one of Efron & Tibshirani, *An Introduction to the Bootstrap* (1993),
  §14.3. Deterministic for a given ``seed``.

  Args:
    x, y: equal-length samples (at least 3 pairs).
    confidence: the interval's coverage, in (0, 1).
    n_resamples: bootstrap resamples.
    seed: seed of the resampling.

  Returns:
    ``(low, high)``; ``(nan, nan)`` where ``ρ`` is undefined on the resamples
    (a constant sample) or the BCa interval is (too few distinct resamples, e.g. 4
    pairs; scipy's ``DegenerateDataWarning`` is not repeated).

  Raises:
    ValueError: different lengths, fewer than 3 pairs, or ``confidence``
      outside (0, 1).
  """
  from scipy import stats  # pylint: disable=g-import-not-at-top

  x, y = _pairs(x, y, "pearson_interval", 3)
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"pearson_interval: confidence={confidence} must be in (0, 1)")

  def rho(a, b, axis=-1):
    ac = a - a.mean(axis=axis, keepdims=True)
    bc = b - b.mean(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
      return np.sum(ac * bc, axis=axis) / np.sqrt(np.sum(ac * ac, axis=axis) *
                                                   np.sum(bc * bc, axis=axis))

  if not np.isfinite(rho(x, y)):
    return math.nan, math.nan
  with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
    warnings.simplefilter("ignore", stats.DegenerateDataWarning)
    result = stats.bootstrap((x, y), rho, paired=True, vectorized=True,
                             n_resamples=int(n_resamples), confidence_level=confidence,
                             method="BCa", rng=np.random.default_rng(seed))
  return float(result.confidence_interval.low), float(result.confidence_interval.high)


def plot_fisher_vs_jacobian(lambda_max: Any, sigma_max: Any, path: str | os.PathLike, *,
                            groups: Sequence[Any] | None = None, title: str | None = None,
                            log: bool = False) -> tuple[str, float]:
  r"""Scatter of ``λ_max(FIM)`` against ``σ_max(J)²`` with Pearson ``ρ`` in the title.

  Figure 2 of Sokol & Park 2020: at initialisation ``λ_max`` of
  the Fisher tracks the squared largest Jacobian singular value (paper:
  ``ρ = 0.64`` cross entropy, ``0.81`` MSE). ``ρ`` is computed on
  ``(σ_max², λ_max)`` as plotted (linear scale, whatever ``log``).

  Args:
    lambda_max: ``(n,)`` Fisher eigenvalues.
    sigma_max: ``(n,)`` largest Jacobian singular values (squared here).
    path: output file.
    groups: optional ``(n,)`` labels (e.g. ``q*`` of each network), one
      colour and legend entry per distinct label.
    title: the title's first line(s), wrapped; ρ and the number of points follow.
    log: log-log axes.

  Returns:
    ``(path, rho)``.

  Raises:
    ValueError: lengths differ, fewer than 2 points, or ``groups`` of the
      wrong length.
  """
  lam = np.asarray(lambda_max, dtype=np.float64).reshape(-1)
  sig2 = np.square(np.asarray(sigma_max, dtype=np.float64).reshape(-1))
  rho = pearson(sig2, lam)
  fig = _figure((4.6, 3.8))
  ax = fig.add_subplot()
  if groups is None:
    ax.scatter(sig2, lam, s=18, alpha=0.8)
  else:
    groups = list(groups)
    if len(groups) != lam.size:
      raise ValueError(f"plot_fisher_vs_jacobian: {len(groups)} groups for {lam.size} points")
    for i, g in enumerate(dict.fromkeys(groups)):
      sel = np.array([h == g for h in groups])
      ax.scatter(sig2[sel], lam[sel], s=18, alpha=0.8, color=f"C{i % 10}", label=str(g))
    ax.legend(fontsize=7)
  if log:
    from matplotlib.ticker import LogFormatter  # pylint: disable=g-import-not-at-top
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):   # plain numbers; within two decades, in-between ones too
      axis.set_major_formatter(LogFormatter(labelOnlyBase=False))
      axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
  ax.set_xlabel(r"$\sigma_{\max}(J)^2$")
  ax.set_ylabel(r"$\lambda_{\max}$(Fisher)")
  heading = [*textwrap.wrap(title, 56), ""] if title else [""]   # the figure's width
  heading[-1] += f"Pearson ρ = {rho:.3f} over {lam.size} points"
  ax.set_title("\n".join(heading), fontsize=9)
  ax.grid(alpha=0.3)
  return _save(fig, path), rho
