"""The report: rows of our numbers beside the paper's, as ``results.json`` and
``report.md`` (printed too); ``python -m experiments.report`` merges several."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
from typing import Any, Callable, Iterable, Sequence

from etils import epath
import jax

from experiments._harness import cli
from experiments._harness import runs
from orthojax.train.config import Config

REPORT = "report.md"


@dataclasses.dataclass
class Row:
  """One line of a report: a setting, a metric, our values and the paper's.

  Attributes:
    setting: ordered columns, e.g. ``{"dataset": "boston", "variant": "gmp"}``.
    metric: what is compared, e.g. ``"test RMSE"``.
    ours: our values, one per seed / split (the table shows mean ± std, n).
    paper: the paper's number (None: the paper has none).
    note: a short remark for this row.
  """

  setting: dict[str, Any]
  metric: str
  ours: list[float]
  paper: float | None = None
  note: str = ""

  def stats(self) -> tuple[float, float, int]:
    values = [v for v in self.ours if v is not None and math.isfinite(v)]
    if not values:
      return math.nan, math.nan, 0
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, math.sqrt(var), len(values)

  def to_json(self) -> dict[str, Any]:
    mean, std, n = self.stats()
    return {"setting": self.setting, "metric": self.metric, "ours": self.ours, "mean": mean,
            "std": std, "n": n, "paper": self.paper, "note": self.note}

  @classmethod
  def from_json(cls, d: dict[str, Any]) -> "Row":
    return cls(setting=dict(d["setting"]), metric=d["metric"], ours=list(d["ours"]),
               paper=d.get("paper"), note=d.get("note", ""))


def number_format(*values: float | None, digits: int = 4) -> Callable[[float | None], str]:
  """One format for numbers that are compared (a row's paper, mean, std and Δ).

  ``digits`` significant digits of the largest finite ``|value|`` and every
  number to that same decimal place: for a largest of magnitude ``10^e``,
  ``max(digits − 1 − e, 0)`` decimals — ``3.704 ± 0.888``, paper ``3.370``,
  Δ ``0.334``; ``73.63``; ``12346`` — or ``digits − 1`` decimals in scientific
  notation when it is ≥ 1e6 or < 1e-3. None and non-finite numbers print ``—``.
  """
  finite = [abs(v) for v in values if v is not None and math.isfinite(v)]
  largest = max(finite, default=0.0)
  if largest and not 1e-3 <= largest < 1e6:
    spec = f".{digits - 1}e"
  else:
    exponent = math.floor(math.log10(largest)) if largest else 0
    spec = f".{max(digits - 1 - exponent, 0)}f"

  def fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
      return "—"
    text = format(x, spec)
    return text.lstrip("-") if float(text) == 0 else text   # no "-0.000"

  return fmt


def plural(count: int, noun: str) -> str:
  """``"1 seed"``, ``"3 seeds"``: a count and its noun, for titles and notes."""
  return f"{count} {noun}{'' if count == 1 else 's'}"


def markdown_table(rows: Sequence[Row], extra_columns: Sequence[str] = ()) -> str:
  """Rows as a markdown table: setting columns, metric, paper, ours (mean ± std, n), Δ.

  A row's numbers share one format (:func:`number_format`): same decimals for
  the paper, the mean, the std and ours − paper.
  """
  columns: list[str] = list(extra_columns)
  for row in rows:
    for key in row.setting:
      if key not in columns:
        columns.append(key)
  header = columns + ["metric", "paper", "ours (mean ± std)", "n", "ours − paper", "note"]
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  for row in rows:
    mean, std, n = row.stats()
    delta = mean - row.paper if row.paper is not None and n else None
    fmt = number_format(mean, row.paper)
    ours = f"{fmt(mean)} ± {fmt(std)}" if n > 1 else fmt(mean)
    cells = [str(row.setting.get(c, "")) for c in columns]
    cells += [row.metric, fmt(row.paper), ours, str(n), fmt(delta), row.note]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def write_report(workdir: str, *, experiment: str, title: str, rows: Sequence[Row],
                 config: Config | None = None, notes: Iterable[str] = (),
                 plots: Iterable[str] = (), seconds: float | None = None,
                 print_fn: Callable[[str], Any] = cli.echo) -> str:
  """Write ``results.json`` and ``report.md`` to ``workdir``; print the table
  (``print_fn(line)``, default stdout).

  ``seconds`` is this sitting's wall time; the report states the experiment's,
  summed over the sittings that trained (:func:`runs.wall_time`), so a rerun that
  reads finished runs back keeps the real time and a resumed experiment counts
  every sitting. ``report.md`` shows the plots by paths relative to ``workdir``
  (it renders where the workdir is moved or viewed on GitHub); ``results.json``
  and the printed lines keep full paths.

  Returns the markdown of the report.
  """

  notes, plots = list(notes), [_abspath(p) for p in plots]
  seconds = runs.wall_time(workdir, seconds)
  environment = {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "jax": jax.__version__, "backend": jax.default_backend(),
      "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
      "processes": jax.process_count(), "python": platform.python_version(),
      "machine": platform.machine(), "cpus": os.cpu_count()}
  table = markdown_table(rows)
  lines = [f"# {title}", "", table, ""]
  if notes:
    lines += ["Notes:", ""] + [f"- {n}" for n in notes] + [""]
  if plots:
    lines += ["Plots:", ""]
    for p in plots:
      rel = relative_to(p, workdir)
      lines += [f"![{os.path.basename(rel)}]({rel})", ""]
  lines.append(f"Environment: {', '.join(f'{k} {v}' for k, v in environment.items())}"
               + (f"; wall time {seconds:.0f} s" if seconds is not None else "") + ".")
  markdown = "\n".join(lines) + "\n"
  if cli.is_writer():
    runs.write_json(os.path.join(workdir, runs.RESULTS), {
        "experiment": experiment, "title": title, "rows": [r.to_json() for r in rows],
        "notes": notes, "plots": plots, "environment": environment, "seconds": seconds,
        "config": dataclasses.asdict(config) if config is not None else None})
    (epath.Path(workdir) / REPORT).write_text(markdown)
    print_fn("\n" + markdown)
    print_fn(f"Report: {os.path.join(_abspath(workdir), REPORT)}")
    for p in plots:
      print_fn(f"Plot: {p}")
  return markdown


def relative_to(path: str, workdir: str) -> str:
  """``path`` relative to ``workdir`` (local or ``gs://…``); unchanged when it lies outside."""
  path, root = str(path), str(workdir).rstrip("/")
  if "://" in path or "://" in root:
    return path[len(root) + 1:] if path.startswith(root + "/") else path
  rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
  return path if rel.startswith("..") else rel


def read_results(workdir: str) -> dict[str, Any]:
  """``results.json`` of an experiment workdir (a clear error when it is missing)."""
  path = epath.Path(workdir) / runs.RESULTS
  if not path.exists():
    raise FileNotFoundError(f"{path}: no results; run the experiment with "
                            f"--workdir={workdir} first")
  return json.loads(path.read_text())




def _abspath(path: str) -> str:
  return path if "://" in str(path) else os.path.abspath(path)
