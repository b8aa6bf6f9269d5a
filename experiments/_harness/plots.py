"""Plots shared by the experiments: ours as bars beside the paper's diamonds; saving
figures locally or to ``gs://…``."""

from __future__ import annotations

import io
import os
import tempfile
import textwrap
from typing import Any, Callable, Sequence

from etils import epath

from experiments._harness.report import Row
from experiments._harness.runs import Run
from orthojax.train import data as data_lib
from orthojax.train import metrics as metrics_lib


def pyplot() -> Any:
  """``matplotlib.pyplot`` on the Agg backend (no display needed); imported here, when a
  figure is drawn, so a run that plots nothing (or stops on a bad flag) does not load it."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


PAPER_MARKER = {"marker": "D", "markersize": 7, "markerfacecolor": "white",
                "markeredgecolor": "crimson", "markeredgewidth": 1.6, "linestyle": "none"}
"""The paper's numbers in :func:`bar_figure`: hollow red diamonds (ours: bars, black error bars)."""


def data_label(dataset: str) -> str:
  """The dataset's name for a plot title; the ``fake`` set (random images, the smoke
  runs') says so: its numbers mean nothing."""
  return ("FAKE data (random images: a smoke test, the numbers mean nothing)"
          if dataset == "fake" else dataset)


def plot_rows(rows: Sequence[Row], path: str, *, group: str, series: str,
              title: str = "", ylabel: str = "", paper_label: str = "paper") -> str:
  """:func:`bar_figure` saved as a PNG at ``path``; returns ``path``."""
  return save_figure(bar_figure(rows, group=group, series=series, title=title, ylabel=ylabel,
                                paper_label=paper_label), path)


def _ours_label(rows: Sequence[Row]) -> str:
  """The legend's words for the bars: how many runs each is the mean of."""
  counts = {r.stats()[2] for r in rows}
  if counts == {1}:
    return "ours (one run)"
  if len(counts) == 1:
    return f"ours (mean ± std of {counts.pop()} runs)"
  return "ours (mean ± std over runs)"


def bar_figure(rows: Sequence[Row], *, group: str, series: str, title: str = "",
               ylabel: str = "", paper_label: str = "paper") -> Any:
  """Bar chart: one panel per (metric, ``group`` value), one bar per ``series`` value.

  Ours: a bar at the mean with a black ± std error bar (capped); the paper:
  a hollow red diamond (:data:`PAPER_MARKER`) on the bar's slot, called
  ``paper_label`` in the legend (say there when the paper's setting differs from the
  run's). One legend, under the panels, says how many runs a bar is the mean of. The
  y axis is labelled ``ylabel`` (default: the metric) and starts at 0 for
  non-negative numbers, so an all-zero panel is a flat 0, not noise. Returns the figure.
  """
  plt = pyplot()
  metrics = list(dict.fromkeys(r.metric for r in rows))
  groups = list(dict.fromkeys(str(r.setting.get(group)) for r in rows))
  names = list(dict.fromkeys(str(r.setting.get(series)) for r in rows))
  panels = len(metrics) * len(groups)
  slanted = sum(len(n) for n in names) > 24   # tick labels that would collide level
  panel_width = max(1.6 + 0.7 * len(names), 3.2)
  fig, axes = plt.subplots(1, panels, squeeze=False, layout="constrained",
                           figsize=(max(panel_width * panels, 5.0), 4.0))
  ours = _ours_label(rows)
  panel = 0
  for metric in metrics:
    for g in groups:
      ax = axes[0, panel]
      panel += 1
      values = []   # means, means + std and the paper's: what the axis must show
      for i, name in enumerate(names):
        match = [r for r in rows if r.metric == metric and str(r.setting.get(group)) == g
                 and str(r.setting.get(series)) == name]
        if not match:
          continue
        mean, std, _ = match[0].stats()
        ax.bar(i, mean, 0.6, yerr=std, capsize=4, color="C0", alpha=0.85,
               error_kw={"ecolor": "black", "elinewidth": 1.2, "capthick": 1.2}, label=ours)
        values += [v for v in (mean, mean + std, match[0].paper) if v is not None and v == v]
        if match[0].paper is not None:   # on the bar's own slot
          ax.plot(i, match[0].paper, label=paper_label, zorder=3, **PAPER_MARKER)
      ax.set_xticks(range(len(names)), names, rotation=30 if slanted else 0,
                    ha="right" if slanted else "center")
      ax.set_xlim(-0.6, len(names) - 0.4)
      if values and min(values) >= 0:
        ax.set_ylim(0, 1.12 * max(values) if max(values) > 0 else 1.0)
      ax.set_ylabel(ylabel or metric, fontsize=9)
      ax.set_xlabel(series, fontsize=9)
      ax.set_title(f"{group} {g}: {metric}", fontsize=9)
  legend = {}   # one entry per label, from whichever panel has it
  for ax in axes[0]:
    for handle, label in zip(*ax.get_legend_handles_labels()):
      legend.setdefault(label, handle)
  if legend:
    fig.legend(legend.values(), legend.keys(), fontsize=8, loc="outside lower center",
               ncol=len(legend))
  if title:
    suptitle(fig, title)
  return fig


def suptitle(fig: Any, title: str) -> None:
  """``fig``'s title in 9-point text, wrapped at whole words to the figure's width."""
  width_chars = int(fig.get_figwidth() * 14)   # what a line of 9-point text holds
  fig.suptitle("\n".join(line for part in title.split("\n")
                         for line in textwrap.wrap(part, width_chars)), fontsize=9)


def plot_curves(workdir: str, runs: Sequence[Run], path: str, title: str) -> str:
  """Eval top-1 / top-5 (%) against epochs for every run (from each ``metrics.jsonl``)."""
  plt = pyplot()

  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  for run in runs:
    config = run.config
    info = data_lib.dataset_info(config.data["name"], data_dir=config.data_dir,
                                 **config.options)
    per_epoch = max(info.num_train // config.batch_size, 1)
    records = [r for r in metrics_lib.read_jsonl(os.path.join(run.directory(workdir),
                                                              "metrics.jsonl"))
               if r.get("split") == "eval"]
    by_step = {r["step"]: r for r in records}      # a resumed run may repeat a step
    steps = sorted(by_step)
    for ax, key in zip(axes, ("top1", "top5")):
      if steps and key in by_step[steps[0]]:
        ax.plot([s / per_epoch for s in steps], [100 * by_step[s][key] for s in steps],
                "o-", ms=3, label=run.name.replace("/", " "))
  for ax, key in zip(axes, ("top-1", "top-5")):
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"eval {key} (%)")
    top = max((max(line.get_ydata()) for line in ax.get_lines() if len(line.get_ydata())),
              default=0.0)
    ax.set_ylim(0, max(1.1 * top, 1.0))   # accuracy from 0: a flat 0 is a flat 0, not noise
    ax.legend(fontsize=7)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  return save_figure(fig, path, dpi=100)


def log_axis(ax: Any, which: str = "y") -> None:
  """Put the ``which`` ("x" or "y") axis of ``ax`` on a log scale with plain numbers
  (``30``, not ``3×10¹``), the in-between ticks labelled too when the data span under
  two decades, so that a narrow range still reads."""
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  getattr(ax, f"set_{which}scale")("log")
  axis = getattr(ax, f"{which}axis")
  axis.set_major_formatter(ticker.LogFormatter(labelOnlyBase=False))
  axis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def save_figure(fig: Any, path: str, dpi: int = 110) -> str:
  """Save a matplotlib figure as PNG (local or ``gs://…``), close it, return ``path``."""
  plt = pyplot()
  buffer = io.BytesIO()
  fig.savefig(buffer, dpi=dpi, format="png")
  plt.close(fig)
  out = epath.Path(path)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_bytes(buffer.getvalue())
  return str(path)


def local_render(path: str, render: Callable[[str], Any]) -> Any:
  """``render(p)`` for a function that can only write local files (e.g. the
  :mod:`orthojax.analysis` plots): renders into a temporary file and copies it
  to ``path`` when that is on a cloud bucket. Returns what ``render`` returns."""
  if "://" not in str(path):
    return render(path)
  with tempfile.TemporaryDirectory() as tmp:
    local = os.path.join(tmp, os.path.basename(str(path)))
    out = render(local)
    out_path = epath.Path(path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(epath.Path(local).read_bytes())
  return out
