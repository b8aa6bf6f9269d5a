r"""Merge the reports of several experiment runs into one table.

    python -m experiments.report runs/uci runs/seq_mnist runs/deep_linear [--output=all.md]

Reads each workdir's ``results.json`` (written by every experiment) and
prints one markdown section per experiment — the paper's numbers beside ours
— with a ``run`` column when an experiment appears in more than one workdir
(e.g. the honest and the released UCI protocol side by side). ``--output``
also writes the markdown to a file.
"""

from __future__ import annotations

import os
from typing import Sequence

from absl import app
from absl import flags

from experiments import _harness

_OUTPUT = flags.DEFINE_string("output", "", "Also write the merged markdown here.")


def _plot_link(plot: str, workdir: str, base: str) -> str:
  """Where ``plot`` (a path ``results.json`` recorded) is now, relative to ``base``.

  A plot inside the workdir it was written to is found under ``workdir`` as given,
  also when that workdir has been moved since (by its name there).
  """
  inside = _harness.relative_to(plot, workdir)
  if inside == plot and "://" not in plot:   # written elsewhere, or the workdir moved
    moved = os.path.join(workdir, os.path.basename(plot))
    inside = os.path.basename(plot) if os.path.exists(moved) else None
  if inside is None or "://" in workdir:
    return plot if inside is None else f"{workdir.rstrip('/')}/{inside}"
  return os.path.relpath(os.path.join(workdir, inside), base)


def merge(workdirs: Sequence[str], base: str = ".") -> str:
  """The merged markdown of the reports in ``workdirs`` (in the order given), with the
  plots linked relative to the directory ``base`` (where the markdown is read from).

  Raises:
    FileNotFoundError: a workdir without ``results.json``.
    ValueError: no workdirs.
  """
  if not workdirs:
    raise ValueError("no workdirs given; usage: python -m experiments.report WORKDIR [...]")
  by_experiment: dict[str, list[tuple[str, dict]]] = {}
  for workdir in workdirs:
    results = _harness.read_results(workdir)
    by_experiment.setdefault(results["experiment"], []).append((workdir, results))
  sections = ["# orthojax experiments: ours beside the papers", ""]
  for experiment, entries in by_experiment.items():
    title = entries[0][1]["title"]
    rows = []
    for workdir, results in entries:
      for d in results["rows"]:
        row = _harness.Row.from_json(d)
        if len(entries) > 1:
          row.setting = {"run": os.path.basename(os.path.normpath(workdir)), **row.setting}
        rows.append(row)
    sections += [f"## {title}", "", _harness.markdown_table(rows), ""]
    for workdir, results in entries:
      for note in results.get("notes", []):
        prefix = f"{os.path.basename(os.path.normpath(workdir))}: " if len(entries) > 1 else ""
        sections.append(f"- {prefix}{note}")
      for plot in results.get("plots", []):
        sections.append(f"- plot: {_plot_link(plot, workdir, base)}")
    sections.append("")
  return "\n".join(sections)


def main(argv: Sequence[str]) -> None:
  try:
    markdown = merge(argv[1:], base=os.path.dirname(os.path.abspath(_OUTPUT.value))
                     if _OUTPUT.value else ".")
  except (FileNotFoundError, ValueError) as e:
    _harness.fail(str(e))
  print(markdown)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      f.write(markdown)


if __name__ == "__main__":
  app.run(main)
