"""A run of an experiment: where it trains, its record, and the experiment's wall time."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

from etils import epath

from experiments._harness import cli
from experiments._harness import fingerprints
from orthojax.train import metrics as metrics_lib
from orthojax.train import trainer
from orthojax.train.config import Config

RESULTS = "results.json"
WALL_TIME = "wall_time.json"
_RECORD_KEYS = ("tags", "final_step", "seconds", "train", "eval", "best")


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of an experiment.

  Attributes:
    tags: the setting, e.g. ``(("dataset", "boston"), ("variant", "gmp"), ("split", 3))``;
      also the run's directory ``dataset=boston/variant=gmp/split=3``.
    config: the full training config (its ``workdir`` is set by :func:`execute`).
    devices: devices to train on (None: all). Tiny full-batch runs use one.
    hooks: ``hook(step, model) -> dict`` on the schedule of ``config.hooks``.
    single: the experiment's only run (E1: one norm per job) trains in the workdir
      itself — ``<workdir>/checkpoints``, ``metrics.jsonl``, ``config.json`` — the
      layout ``experiments.train`` writes, so either entry point resumes the other.
      Other runs train in ``<workdir>/runs/<tags>``.
  """

  tags: tuple[tuple[str, Any], ...]
  config: Config
  devices: Any = None
  hooks: tuple[Callable[..., Any], ...] = ()
  single: bool = False

  @property
  def name(self) -> str:
    return "/".join(f"{k}={v}" for k, v in self.tags)

  def directory(self, workdir: str) -> str:
    """Where the run trains: ``workdir`` for a single run, else ``workdir/runs/<tags>``."""
    return workdir if self.single else os.path.join(workdir, "runs", self.name)

  def file(self, workdir: str, name: str) -> str:
    """A file of the run's directory (``metrics.jsonl``, ``result.json``, …)."""
    return os.path.join(self.directory(workdir), name)


def split_record_key(split: str) -> str:
  """The record key of a ``--final_eval_splits`` entry: the split's name, or
  ``<split>_split`` where that name is taken (``train`` holds the logged
  training metrics, ``eval`` the final evaluation)."""
  return f"{split}_split" if split in _RECORD_KEYS else split


def result_path(run: Run, workdir: str) -> str:
  """``result.json`` of ``run``: it exists once the run finished (:func:`execute` then
  reads it back instead of training)."""
  return run.file(workdir, "result.json")


def execute(run: Run, workdir: str, *, verbose: bool = False,
            extra: Callable[[Any], dict[str, Any]] | None = None,
            print_fn: Callable[[str], Any] = cli.echo) -> dict[str, Any]:
  """Train ``run`` in :meth:`Run.directory` and return its record.

  The record (also ``result.json`` in the run directory) holds the tags, the
  final step, the train / eval / final-split metrics (key
  :func:`split_record_key`), the best eval, the wall
  time and ``extra(result)`` — an experiment's own numbers computed from the
  :class:`~orthojax.train.trainer.TrainResult` (e.g. spectra of the final
  weights; a ``"headline"`` string there replaces the metrics in the
  one-line summary) and the run's fingerprint (:mod:`.fingerprints`). A run whose
  ``result.json`` exists is not trained again: it is read back when its fingerprint is
  this config's, else refused in one line naming the keys that differ (exit 2).

  ``print_fn(line)`` takes the console lines: the run's summary, its resume and
  checkpoint notices, and with ``verbose`` every line of the run (the trainer's
  ``print_fn``).
  """

  done = result_path(run, workdir)
  config = run.config.replace(workdir=run.directory(workdir))
  fingerprint = fingerprints.fingerprint(config)
  if epath.Path(done).exists():
    record = json.loads(epath.Path(done).read_text())
    cli.fail_on_config_error(lambda: fingerprints.check_finished_run(
        record, run.directory(workdir), config))
    print_fn(f"  {run.name}: done earlier ({_summary(record)})")
    return record

  def quiet(line: str) -> None:   # a run's own lines only with --verbose
    if verbose or line.startswith(("Resumed", "Preempted", "Checkpoint step", "  moved to")):
      print_fn(line)

  start_time = time.perf_counter()
  result = cli.fail_on_config_error(lambda: trainer.train(
      config, hooks=run.hooks, devices=run.devices, print_fn=quiet))
  count_sitting(workdir)
  if result.preempted:
    print(f"preempted during {run.name}: checkpoint saved; rerun the same command to resume "
          f"(exit status {trainer.PREEMPTED_EXIT_CODE})", file=sys.stderr)
    raise SystemExit(trainer.PREEMPTED_EXIT_CODE)
  record = {
      "tags": dict(run.tags),
      "final_step": result.final_step,
      "seconds": time.perf_counter() - start_time,
      "train": result.train_metrics,
      "eval": result.eval_metrics,
      **{split_record_key(split): metrics for split, metrics in result.split_metrics.items()},
      "best": result.best_eval,
      **(extra(result) if extra else {}),
      fingerprints.KEY: fingerprint,
  }
  if cli.is_writer():
    write_json(done, record)
  print_fn(f"  {run.name}: {_summary(record)}")
  return record


def _summary(record: dict[str, Any]) -> str:
  """One line per run: the experiment's ``headline`` (from ``extra``) or test/eval metrics."""
  parts = [f"step {record['final_step']}"]
  if record.get("headline"):
    parts.append(record["headline"])
  else:
    for split in ("test", "eval"):
      for key in ("top1", "rmse", "loss"):
        if key in record.get(split, {}):
          parts.append(f"{split} {key} {record[split][key]:.4g}")
          break
  if record.get("seconds") is not None:
    parts.append(f"{record['seconds']:.1f} s")
  return ", ".join(parts)


def throughput(run_dir: str, batch_size: int) -> dict[str, float]:
  """Training speed of a run from its ``metrics.jsonl``: median steps/s × batch.

  Returns ``{"steps_per_sec", "images_per_sec", "intervals"}`` (NaN without
  a logged interval: the first train line of each process has no rate).
  """
  rates = [r["steps_per_sec"] for r in metrics_lib.read_jsonl(
      os.path.join(run_dir, "metrics.jsonl")) if r.get("split") == "train"
           and "steps_per_sec" in r]
  if not rates:
    return {"steps_per_sec": float("nan"), "images_per_sec": float("nan"), "intervals": 0}
  rate = statistics.median(rates)
  return {"steps_per_sec": rate, "images_per_sec": rate * batch_size, "intervals": len(rates)}


def write_json(path: str, value: Any) -> None:
  """Write atomically: a crash leaves the old file or none, never half of one.

  Local or cloud (``gs://…``) paths alike (``etils.epath``).
  """
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(value, indent=1, default=_jsonable))
  tmp.replace(path)


def _jsonable(x: Any) -> Any:
  try:
    return float(x)
  except (TypeError, ValueError):
    return str(x)


# -------------------------------------------------------------- Wall time --
#
# An experiment's wall time is the sum over its *sittings* (processes that ran it)
# that trained at least one run; each sitting's time is logged in
# ``<workdir>/wall_time.json`` as ``{sitting id: seconds}``:
#
#     wall time = Σ_sittings that trained  (end − start of that sitting)
#
# A sitting starts at :func:`cli.start` and ends at the report (its ``seconds``); it is
# also logged after every run it trains (:func:`count_sitting`, which an experiment also
# calls for work that is not a training run), so one killed or preempted before its
# report still counts up to its last finished run. A rerun that only reads finished runs
# back trains nothing and adds nothing: its report keeps the real time instead of the
# seconds it took to re-read the records.


class Sitting:
  """This process's share of the experiment's wall time (see the section comment)."""

  def __init__(self):
    self.reset()

  def reset(self) -> None:
    self.id = (datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
               + f"-{os.getpid()}")
    self.start = time.perf_counter()
    self.trained = False


SITTING = Sitting()


def read_sittings(workdir: str) -> dict[str, float]:
  path = epath.Path(workdir) / WALL_TIME
  return json.loads(path.read_text()) if path.exists() else {}


def _log_sitting(workdir: str, seconds: float) -> dict[str, float]:
  """Set this sitting's seconds in ``<workdir>/wall_time.json``; return every sitting's."""
  sittings = {**read_sittings(workdir), SITTING.id: float(seconds)}
  write_json(os.path.join(workdir, WALL_TIME), sittings)
  return sittings


def count_sitting(workdir: str) -> None:
  """This sitting did an experiment's work (trained a run, measured a network): its
  time counts in the wall time, logged up to now (a sitting killed later still counts)."""
  SITTING.trained = True
  if cli.is_writer():
    _log_sitting(workdir, time.perf_counter() - SITTING.start)


def wall_time(workdir: str, seconds: float | None) -> float | None:
  """The experiment's wall time over its sittings, ``seconds`` being this sitting's.

  A sitting that trained nothing does not count; when no sitting is logged (a
  workdir written before the log existed) the previous report's time is kept,
  else ``seconds``.
  """
  if SITTING.trained and seconds is not None:
    sittings = _log_sitting(workdir, seconds) if cli.is_writer() else read_sittings(workdir)
  else:
    sittings = read_sittings(workdir)
  if sittings:
    return sum(sittings.values())
  previous = epath.Path(workdir) / RESULTS
  if not SITTING.trained and previous.exists():
    return json.loads(previous.read_text()).get("seconds", seconds)
  return seconds
