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


def merge(workdirs: Sequence[str]) -> str:
  """The merged markdown of the reports in ``workdirs`` (in the order given).

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
        sections.append(f"- plot: {plot}")
    sections.append("")
  return "\n".join(sections)


def main(argv: Sequence[str]) -> None:
  try:
    markdown = merge(argv[1:])
  except (FileNotFoundError, ValueError) as e:
    _harness.fail(str(e))
  print(markdown)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      f.write(markdown)


if __name__ == "__main__":
  app.run(main)
