"""Plots shared by the experiments: ours as bars beside the paper's diamonds; saving
figures locally or to ``gs://…``."""

from __future__ import annotations

import io
import os
import tempfile
import textwrap
from typing import Any, Callable, Sequence

from etils import epath
import matplotlib
import matplotlib.pyplot as plt

from experiments._harness.report import Row
from experiments._harness.runs import Run
from orthojax.train import data as data_lib
from orthojax.train import metrics as metrics_lib


def pyplot() -> Any:
  """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
  matplotlib.use("Agg")
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
              title: str = "", ylabel: str = "") -> str:
  """:func:`bar_figure` saved as a PNG at ``path``; returns ``path``."""
  return save_figure(bar_figure(rows, group=group, series=series, title=title, ylabel=ylabel),
                     path)


def bar_figure(rows: Sequence[Row], *, group: str, series: str, title: str = "",
               ylabel: str = "") -> Any:
  """Bar chart: one panel per (metric, ``group`` value), one bar per ``series`` value.

  Ours: a bar at the mean with a black ± std error bar (capped); the paper:
  a hollow red diamond (:data:`PAPER_MARKER`) beside the error bar, each with its
  legend entry. The
  y axis is labelled ``ylabel`` (default: the metric). Returns the figure.
  """
  plt = pyplot()
  metrics = list(dict.fromkeys(r.metric for r in rows))
  groups = list(dict.fromkeys(str(r.setting.get(group)) for r in rows))
  names = list(dict.fromkeys(str(r.setting.get(series)) for r in rows))
  panels = len(metrics) * len(groups)
  fig, axes = plt.subplots(1, panels, squeeze=False, figsize=(max(3.2 * panels, 5.0), 3.8))
  width = 0.8 / max(len(names), 1)
  panel = 0
  for metric in metrics:
    for g in groups:
      ax = axes[0, panel]
      panel += 1
      for i, name in enumerate(names):
        match = [r for r in rows if r.metric == metric and str(r.setting.get(group)) == g
                 and str(r.setting.get(series)) == name]
        if not match:
          continue
        mean, std, _ = match[0].stats()
        ax.bar(i * width, mean, width, yerr=std, capsize=4, color=f"C{i}", alpha=0.85,
               error_kw={"ecolor": "black", "elinewidth": 1.2, "capthick": 1.2},
               label="ours (mean ± std)")
        if match[0].paper is not None:   # on the bar's own slot, above its error bar
          ax.plot(i * width, match[0].paper, label="paper", zorder=3, **PAPER_MARKER)
      ax.set_xticks([i * width for i in range(len(names))], names, rotation=45)
      ax.set_ylabel(ylabel or metric, fontsize=9)
      ax.set_title(f"{g}: {metric}", fontsize=9)
  legend = {}   # one entry per label, from whichever panel has it
  for ax in axes[0]:
    for handle, label in zip(*ax.get_legend_handles_labels()):
      legend.setdefault(label, handle)
  if legend:
    axes[0, 0].legend(legend.values(), legend.keys(), fontsize=7, loc="lower right")
  width_chars = int(fig.get_figwidth() * 14)   # what a line of 9-point text holds
  fig.suptitle("\n".join([*textwrap.wrap(title, width_chars), *textwrap.wrap(
      "bars: ours (mean ± std, black error bars); hollow red diamonds: the paper",
      width_chars)]), fontsize=9)
  fig.tight_layout()
  return fig


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
