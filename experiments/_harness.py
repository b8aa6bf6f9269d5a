"""What every experiment shares: flags → runs → :func:`orthojax.train.trainer.train` → report.

An experiment module (``experiments/uci.py``, …) is thin:

1. its flagfile names a config file and overrides
   (``--config=experiments/configs/<exp>.py[:variant]``, ``--config.a.b=value``: an
   ``ml_collections`` ConfigDict whose keys are those of
   :class:`~orthojax.train.config.Config`) and sets the experiment's own flags;
2. it turns the base :class:`~orthojax.train.config.Config` into a list of
   :class:`Run` s (one per variant × seed × split …), each tagged with the
   setting it belongs to;
3. :func:`execute` trains each run in ``<workdir>/runs/<tags>/`` (a finished
   run is read back instead of retrained, an unfinished one resumes from its
   checkpoint — rerunning the same command continues an interrupted
   experiment);
4. it turns the records into :class:`Row` s — a setting, a metric, our
   values over seeds/splits, the paper's number — and :func:`write_report`
   writes ``results.json`` and ``report.md`` and prints the table.

``python -m experiments.report <workdirs…>`` merges several reports.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import math
import os
import platform
import sys
import pathlib
import tempfile
import time
from typing import Any, Callable, Iterable, Mapping, NoReturn, Sequence

from absl import flags
from absl import logging
from etils import epath

from ml_collections import config_flags

from orthojax.train import config as config_lib
from orthojax.train import distributed
from orthojax.train import overrides as overrides_lib
from orthojax.train.config import Config
from orthojax.train.config import ConfigError

RESULTS = "results.json"
REPORT = "report.md"
WALL_TIME = "wall_time.json"


# ------------------------------------------------------------------- Flags --

CONFIGS = pathlib.Path(__file__).resolve().parent / "configs"


def define_flags(default_config: str = "train.py") -> None:
  """``--config`` (an ``experiments/configs`` file, default ``default_config``),
  ``--workdir``, ``--config_help``, the multi-process flags and the shared ones."""
  if "config" in flags.FLAGS:
    return
  try:
    _define_config(default_config)
  except (*_LOAD_ERRORS, config_flags.config_flags.UnsupportedOperationError) as e:
    _fail_to_load(e, sys.argv)   # the default config file does not load
  flags.DEFINE_string("workdir", "", "Output directory: checkpoints, metrics.jsonl, "
                      "TensorBoard files, results and the report. Rerunning resumes there.")
  flags.DEFINE_bool("config_help", False, "Print the config (after overrides) and the "
                    "constructors its sections may name, with their keywords, and exit.")
  _define_shared()


def _define_config(default_config: str) -> None:
  config_flags.DEFINE_config_file(
      "config", str(CONFIGS / default_config),
      "The training config: a Python file whose get_config(arg) returns an ml_collections "
      "ConfigDict with the keys of orthojax.train.Config (experiments/configs/*.py), "
      "optionally FILE:arg (e.g. e1_resnet50.py:gmp_imn); override any key with "
      "--config.key=value (--config.optimizer.euclidean.learning_rate=0.1). --config_help prints "
      "the config and every model / optimizer / manifold a section may name.",
      lock_config=True, sys_argv=sys.argv[:1])   # overrides: ours (orthojax.train.overrides)


def _define_shared() -> None:
  flags.DEFINE_bool("distributed", False,
                    "Initialise jax.distributed (auto-detects TPU pods / SLURM).")
  flags.DEFINE_string("coordinator_address", "",
                      "host:port of process 0, for explicit multi-process runs.")
  flags.DEFINE_integer("num_processes", 0, "Processes, with --coordinator_address.")
  flags.DEFINE_integer("process_id", -1, "This process, with --coordinator_address.")
  flags.DEFINE_bool("verbose", False, "Print every run's train/eval lines, not just summaries.")
  # Shared by several experiments (one process may import them all, e.g. pytest):
  flags.DEFINE_list("variants", [], "The experiment's variants to run (its docstring lists "
                    "them); empty: all of them.")
  flags.DEFINE_integer("num_seeds", 0, "Seeds per setting: --seed, --seed+1, ...; 0: the "
                       "experiment's default.")
  flags.DEFINE_string("compile_for", "", "Pod compile check: compile the exact train and eval "
                      "steps for this TPU topology (e.g. v5e:8x8, v4:2x2x4; with --config.mesh.num_slices "
                      "for multi-slice) with libtpu, without TPUs or data; print the per-chip "
                      "HBM, FLOPs, collectives and roofline, write compile_report.json to "
                      "--workdir, and stop (exit 1 if it does not fit).")


_OVERRIDES: list[str] = []   # the --config.KEY=VALUE arguments, in order, flagfiles expanded


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing, with a bad flag as one line (absl prints two) and exit 2.

  The ``--config.KEY=VALUE`` overrides (flagfiles expanded) are kept aside and applied
  by :func:`config_dict` with :mod:`orthojax.train.overrides`, which can also switch a
  section's constructor and create a section the file leaves None."""
  from ml_collections.config_flags import config_flags as mlc_flags  # pylint: disable=g-import-not-at-top
  argv = list(argv)
  try:
    expanded = flags.FLAGS.read_flags_from_files(argv[1:], force_gnu=False)
  except flags.CantOpenFlagFileError as e:
    given = [a for a in argv if a.startswith(("--flagfile=", "-flagfile="))]
    reason = str(e).rsplit("]", 1)[-1].split(":")[0].strip() or "cannot open it"
    fail(f"{given[-1] if given else '--flagfile'}: cannot open it ({reason})")
  _OVERRIDES[:] = [a for a in expanded if overrides_lib.is_override(a)]
  try:
    return flags.FLAGS([argv[0], *(a for a in expanded if not overrides_lib.is_override(a))])
  except flags.Error as e:
    cause = e.__cause__ or e.__context__
    if cause is not None and not isinstance(cause, flags.Error):
      _fail_to_load(cause, argv)
    fail(" ".join(str(e).split("\n")[0].split()))
  except (*_LOAD_ERRORS, mlc_flags.UnsupportedOperationError) as e:
    _fail_to_load(e, argv)


_LOAD_ERRORS = (AttributeError, KeyError, TypeError, ValueError, OSError)


def _fail_to_load(e: Exception, argv: Sequence[str]) -> NoReturn:
  """One line for a config file that does not load."""
  given = [a for a in argv if a.startswith("--config=")]
  cause = e.__cause__ or e
  while cause.__cause__ is not None:
    cause = cause.__cause__
  last = [l for l in str(cause).replace("config_config", "the file").splitlines() if l.strip()]
  fail(f"{given[-1] if given else '--config'}: cannot load it "
       f"({(last[-1].strip() if last else type(cause).__name__)[:300]})")


def overridden(key: str) -> bool:
  """Whether the command line (or a flagfile) sets the dotted config ``key``."""
  return any(overrides_lib.split(a)[0] == key for a in _OVERRIDES)


def config_dict() -> dict[str, Any]:
  """``--config`` as a plain dict with its overrides applied (:func:`parse_flags`), or
  one line and exit 2."""
  from ml_collections.config_flags import config_flags as mlc_flags  # pylint: disable=g-import-not-at-top
  try:
    tree = flags.FLAGS.config.to_dict()   # a file that failed to load raises on first use
  except (*_LOAD_ERRORS, mlc_flags.UnsupportedOperationError) as e:
    _fail_to_load(e, sys.argv)
  try:
    return overrides_lib.apply_all(tree, _OVERRIDES)
  except ConfigError as e:
    fail(f"{e}; --config_help lists the config's keys")


def run(main: Callable[[list[str]], Any]) -> None:
  """``app.run(main)`` with :func:`parse_flags`: every experiment's ``__main__``."""
  from absl import app  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=parse_flags)


def start(argv: Sequence[str]) -> Config:
  """Common start of ``main``: check argv, quiet Orbax, start jax.distributed, read flags.

  Returns the base config, its ranges and choices checked (:meth:`Config.validate`; a bad
  flag exits with one line naming it, status 2). Its sections are checked by building the
  runs' programs (:func:`prepare`).
  """
  if len(argv) > 1:
    raise SystemExit(f"error: unexpected arguments {list(argv[1:])}; flags only")
  _SITTING.reset()
  if not flags.FLAGS["verbosity"].present:   # Orbax logs every save at INFO
    logging.set_verbosity(logging.WARNING)
  fv = flags.FLAGS
  if fv.compile_for:   # abstract TPU devices only; this machine's backend is the CPU
    import jax  # pylint: disable=g-import-not-at-top
    jax.config.update("jax_platforms", "cpu")
  if not fv.config_help:
    distributed.initialize(enabled=fv.distributed, coordinator_address=fv.coordinator_address,
                           num_processes=fv.num_processes, process_id=fv.process_id)
  config = fail_on_config_error(lambda: config_from_flags(fv))
  if fv.config_help and not config.workdir:
    # --config_help exits in prepare(), before any run writes; os.devnull (not a directory)
    # makes an accidental write fail loudly rather than leave a directory behind.
    config = config.replace(workdir=os.devnull)
  return fail_on_config_error(config.validate)


def config_from_flags(fv: flags.FlagValues = flags.FLAGS) -> Config:
  """The :class:`Config` of ``--config`` (+ overrides) and ``--workdir`` (not validated)."""
  tree = config_dict()
  if "workdir" in tree:
    raise ConfigError("config.workdir: set the workdir with --workdir, not in the config")
  return Config.from_dict({**tree, "workdir": fv.workdir})


def print_config_help(config: Config) -> None:
  """``--config_help``: the checked config and every constructor a section may name."""
  from ml_collections import config_dict as mlc_dict  # pylint: disable=g-import-not-at-top
  from orthojax.train import registry  # pylint: disable=g-import-not-at-top
  tree = {k: v for k, v in config.to_dict().items() if k != "workdir"}
  print("The config, as checked for this run (--config.KEY=VALUE overrides any key; "
        "--config.SECTION.name=NAME switches a section's constructor):\n"
        f"{mlc_dict.ConfigDict(tree)}")
  for kind, title in (("model", "config.model.name"),
                      ("optimizer", "config.optimizer.{euclidean,stiefel,oblique}.name"),
                      ("manifold", "config.optimizer.{stiefel,oblique}.manifold.name"),
                      ("layers", "Sequential layers"), ("penalty", "config.penalty"),
                      ("kernel_init", "kernel_init / bias_init")):
    print(f"\n{title}: one of\n{registry.describe(kind)}")


# ------------------------------------------------------ Check by building --

def check_fixed(base: Config, fixed: Mapping[str, str], experiment: str,
                required: Mapping[str, tuple[Any, str]] = {}) -> None:  # pylint: disable=dangerous-default-value
  """The experiment's own rules on the config, declared rather than coded.

  ``fixed``: key → which flag or rule sets it per run. Setting one on the command line,
  or in the config file away from the trainer's default, would have no effect: a
  ConfigError. ``required``: key → (the value the experiment's science needs, why);
  another value is a ConfigError (e.g. E4's characteristic points are ReLU kinks).
  A key ending in ``.*`` stands for every key of that section but ``name`` and
  ``data_dir``.
  """
  tree = config_lib.flatten(base.to_dict())
  defaults = config_lib.flatten(Config().to_dict())
  for key, why in fixed.items():
    keys = ([k for k in tree if k.startswith(key[:-1])
             and not k.endswith((".name", ".data_dir"))]
            if key.endswith(".*") else [key])
    for k in keys:
      value = tree.get(k)
      if overridden(k) or value != defaults.get(k):
        raise ConfigError(f"config.{k}={value!r}: {experiment} sets it per run ({why}); "
                          f"leave it out")
  for key, (want, why) in required.items():
    value = tree.get(key, want)
    if value != want:
      raise ConfigError(f"config.{key}={value!r}: {experiment} needs {want!r} ({why})")


def prepare(runs: Sequence[Run], base: Config, workdir: str) -> None:
  """Check every run the way it will run, then act on ``--config_help`` / ``--compile_for``.

  Each distinct program of ``runs`` (runs that differ only in seed or data split share
  one) is built abstractly (:func:`orthojax.train.program.check`: the model by
  ``nnx.eval_shape``, the optimizer chain, the shardings — no data read, nothing
  compiled), so a bad key stops the experiment in one line before any run trains, naming
  the run it belongs to. Then ``--config_help`` prints the config and exits 0 — it fails
  exactly where the run would — and ``--compile_for`` compiles the programs for the
  topology (:func:`compile_runs`) and exits.
  """
  if not compile_only():   # compile_runs builds the same programs on the topology's chips
    seen: set[str] = set()
    for run in runs:
      key = _program_key(run.config)
      if key in seen:
        continue
      seen.add(key)
      fail_on_config_error(lambda run=run: _check_run(run, len(runs) > 1))
  if flags.FLAGS.config_help:
    print_config_help(base)
    raise SystemExit(0)
  if compile_only():
    compile_runs(runs, workdir)


def _check_run(run: Run, name_it: bool) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  from orthojax.train import program  # pylint: disable=g-import-not-at-top
  try:
    program.check(run.config, devices=run.devices or jax.devices(),
                  num_processes=jax.process_count(), published=flags.FLAGS.config_help)
  except ConfigError as e:
    if not (name_it and run.name):
      raise
    raise ConfigError(f"{e} (run {run.name})") from None


# ----------------------------------------------------------- Compile check --

def compile_only() -> bool:
  """Whether ``--compile_for`` asks to compile the runs instead of training them."""
  return bool(flags.FLAGS.compile_for)


def _program_key(config: Config) -> str:
  """Runs differing only in seed, workdir or data split compile to the same program."""
  data = {k: v for k, v in config.data.items()
          if k not in ("split_index", "data_seed", "permutation_seed")}
  tree = {**config.to_dict(), "seed": 0, "workdir": "", "data": data}
  return json.dumps(tree, sort_keys=True)


def compile_runs(runs: Sequence[Run], workdir: str, *, print_fn: Callable[..., None] = print
                 ) -> NoReturn:
  """``--compile_for``: compile each distinct program of ``runs`` for the topology and stop.

  Prints one table per program, writes them all to ``<workdir>/compile_report.json``
  (nothing is written without ``--workdir``) and exits 0, or 1 with one line
  when the topology, the mesh or the batch is wrong or a program does not fit
  the chip's HBM. A run its experiment pins to ``n`` devices (tiny full-batch
  runs on one) compiles for the topology's first ``n`` chips.
  """
  from orthojax.train import aot  # pylint: disable=g-import-not-at-top
  from orthojax.train import topology  # pylint: disable=g-import-not-at-top
  target = flags.FLAGS.compile_for
  reports: dict[str, Any] = {}
  configs: list[Config] = []
  seen: set[str] = set()
  try:
    for run in runs:
      key = _program_key(run.config)
      if key in seen:
        continue
      seen.add(key)
      print_fn(f"Compiling {run.name or 'the run'} for {target}"
               + (f" × {run.config.mesh.num_slices} slices" if run.config.mesh.num_slices > 1
                  else "")
               + " …", flush=True)
      report = aot.compile_for(run.config, target,
                               num_chips=len(run.devices) if run.devices else None)
      reports[run.name or "run"] = report
      configs.append(run.config)
      print_fn(report.table() + "\n", flush=True)
    if workdir and is_writer():
      print_fn(f"Compile report: {aot.write_reports(workdir, reports)}", flush=True)
    for report, config in zip(reports.values(), configs):
      report.check_fits(config)
  except (ConfigError, ValueError, topology.TopologyError, aot.DoesNotFitError) as e:
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(1) from None
  raise SystemExit(0)


def fail(message: str) -> NoReturn:
  """Stop with ``error: <message>`` on one line of stderr and exit status 2."""
  print(f"error: {message}", file=sys.stderr)
  raise SystemExit(2)


def fail_on_config_error(fn: Callable[[], Any]) -> Any:
  """``fn()``, turning a :class:`ConfigError` or a missing dataset into :func:`fail`
  (exit 2) and a run stopped by its non-finite guard into one line and exit 1."""
  from orthojax.train.data import DatasetNotFoundError  # pylint: disable=g-import-not-at-top
  from orthojax.train.trainer import NonFiniteLossError  # pylint: disable=g-import-not-at-top
  try:
    return fn()
  except ConfigError as e:
    fail(str(e))
  except DatasetNotFoundError as e:   # what is missing and how to get it (ImageNet: steps)
    fail(str(e))
  except NonFiniteLossError as e:
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(1) from None


def num_seeds(default: int) -> int:
  """``--num_seeds``, or ``default`` when it is 0 (a ConfigError when negative)."""
  value = flags.FLAGS.num_seeds
  if value < 0:
    raise ConfigError(f"--num_seeds={value}: must be >= 1 (0: the default, {default})")
  return value or default


def flag_list(name: str, value: Sequence[str], choices: Sequence[str]) -> list[str]:
  """Check a list flag against its choices (a ConfigError naming the flag)."""
  if not value:
    raise ConfigError(f"--{name}: empty; choose from {', '.join(choices)}")
  for item in value:
    if item not in choices:
      raise ConfigError(f"--{name}={','.join(value)}: unknown {item!r}; choose from "
                        f"{', '.join(choices)}")
  return list(value)


def is_writer() -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


# -------------------------------------------------------------------- Runs --

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


# -------------------------------------------------------------- Wall time --
#
# An experiment's wall time is the sum over its *sittings* (processes that ran it)
# that trained at least one run; each sitting's time is logged in
# ``<workdir>/wall_time.json`` as ``{sitting id: seconds}``:
#
#     wall time = Σ_sittings that trained  (end − start of that sitting)
#
# A sitting starts at :func:`start` and ends at :func:`write_report` (its
# ``seconds``); it is also logged after every run it trains (:func:`count_sitting`,
# which an experiment also calls for work that is not a training run), so one killed or
# preempted before its report still counts up to its last finished run. A rerun
# that only reads finished runs back trains nothing and adds nothing: its report
# keeps the real time instead of the seconds it took to re-read the records.


class _Sitting:
  """This process's share of the experiment's wall time (see the section comment)."""

  def __init__(self):
    self.reset()

  def reset(self) -> None:
    self.id = (datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
               + f"-{os.getpid()}")
    self.start = time.perf_counter()
    self.trained = False


_SITTING = _Sitting()


def _read_sittings(workdir: str) -> dict[str, float]:
  path = epath.Path(workdir) / WALL_TIME
  return json.loads(path.read_text()) if path.exists() else {}


def _log_sitting(workdir: str, seconds: float) -> dict[str, float]:
  """Set this sitting's seconds in ``<workdir>/wall_time.json``; return every sitting's."""
  sittings = {**_read_sittings(workdir), _SITTING.id: float(seconds)}
  write_json(os.path.join(workdir, WALL_TIME), sittings)
  return sittings


def count_sitting(workdir: str) -> None:
  """This sitting did an experiment's work (trained a run, measured a network): its
  time counts in the wall time, logged up to now (a sitting killed later still counts)."""
  _SITTING.trained = True
  if is_writer():
    _log_sitting(workdir, time.perf_counter() - _SITTING.start)


def wall_time(workdir: str, seconds: float | None) -> float | None:
  """The experiment's wall time over its sittings, ``seconds`` being this sitting's.

  A sitting that trained nothing does not count; when no sitting is logged (a
  workdir written before the log existed) the previous report's time is kept,
  else ``seconds``.
  """
  if _SITTING.trained and seconds is not None:
    sittings = _log_sitting(workdir, seconds) if is_writer() else _read_sittings(workdir)
  else:
    sittings = _read_sittings(workdir)
  if sittings:
    return sum(sittings.values())
  previous = epath.Path(workdir) / RESULTS
  if not _SITTING.trained and previous.exists():
    return json.loads(previous.read_text()).get("seconds", seconds)
  return seconds


_RECORD_KEYS = ("tags", "final_step", "seconds", "train", "eval", "best")


def split_record_key(split: str) -> str:
  """The record key of a ``--final_eval_splits`` entry: the split's name, or
  ``<split>_split`` where that name is taken (``train`` holds the logged
  training metrics, ``eval`` the final evaluation)."""
  return f"{split}_split" if split in _RECORD_KEYS else split


def result_path(run: Run, workdir: str) -> str:
  """``result.json`` of ``run``: it exists once the run finished (:func:`execute` then
  reads it back instead of training)."""
  return os.path.join(run.directory(workdir), "result.json")


def execute(run: Run, workdir: str, *, verbose: bool = False,
            extra: Callable[[Any], dict[str, Any]] | None = None,
            print_fn: Callable[..., None] = print) -> dict[str, Any]:
  """Train ``run`` in :meth:`Run.directory` and return its record.

  The record (also ``result.json`` in the run directory) holds the tags, the
  final step, the train / eval / final-split metrics (key
  :func:`split_record_key`), the best eval, the wall
  time and ``extra(result)`` — an experiment's own numbers computed from the
  :class:`~orthojax.train.trainer.TrainResult` (e.g. spectra of the final
  weights; a ``"headline"`` string there replaces the metrics in the
  one-line summary). A run whose ``result.json`` exists is not trained again.
  """
  from orthojax.train import trainer  # pylint: disable=g-import-not-at-top

  run_dir = run.directory(workdir)
  done = result_path(run, workdir)
  if epath.Path(done).exists():
    record = json.loads(epath.Path(done).read_text())
    print_fn(f"  {run.name}: done earlier ({_summary(record)})", flush=True)
    return record

  def quiet(*args, **kwargs):   # a run's own lines only with --verbose
    text = " ".join(str(a) for a in args)
    if verbose or text.startswith(("Resumed", "Preempted")):
      print_fn(text, **kwargs)

  start_time = time.perf_counter()
  result = fail_on_config_error(lambda: trainer.train(
      run.config.replace(workdir=run_dir), hooks=run.hooks, devices=run.devices, print_fn=quiet))
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
  }
  if is_writer():
    write_json(done, record)
  print_fn(f"  {run.name}: {_summary(record)}", flush=True)
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


def write_json(path: str, value: Any) -> None:
  """Write atomically: a crash leaves the old file or none, never half of one.

  Local or cloud (``gs://…``) paths alike (``etils.epath``).
  """
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(value, indent=1, default=_jsonable))
  tmp.replace(path)


def _abspath(path: str) -> str:
  return path if "://" in str(path) else os.path.abspath(path)


def _jsonable(x: Any) -> Any:
  try:
    return float(x)
  except (TypeError, ValueError):
    return str(x)


# ----------------------------------------------------------------- Reports --

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
                 print_fn: Callable[..., None] = print) -> str:
  """Write ``results.json`` and ``report.md`` to ``workdir``; print the table.

  ``seconds`` is this sitting's wall time; the report states the experiment's,
  summed over the sittings that trained (:func:`wall_time`), so a rerun that
  reads finished runs back keeps the real time and a resumed experiment counts
  every sitting. ``report.md`` shows the plots by paths relative to ``workdir``
  (it renders where the workdir is moved or viewed on GitHub); ``results.json``
  and the printed lines keep full paths.

  Returns the markdown of the report.
  """
  import jax  # pylint: disable=g-import-not-at-top

  notes, plots = list(notes), [_abspath(p) for p in plots]
  seconds = wall_time(workdir, seconds)
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
  if is_writer():
    write_json(os.path.join(workdir, RESULTS), {
        "experiment": experiment, "title": title, "rows": [r.to_json() for r in rows],
        "notes": notes, "plots": plots, "environment": environment, "seconds": seconds,
        "config": dataclasses.asdict(config) if config is not None else None})
    (epath.Path(workdir) / REPORT).write_text(markdown)
    print_fn("\n" + markdown, flush=True)
    print_fn(f"Report: {os.path.join(_abspath(workdir), REPORT)}", flush=True)
    for p in plots:
      print_fn(f"Plot: {p}", flush=True)
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
  path = epath.Path(workdir) / RESULTS
  if not path.exists():
    raise FileNotFoundError(f"{path}: no results; run the experiment with "
                            f"--workdir={workdir} first")
  return json.loads(path.read_text())


# ------------------------------------------------------------------- Plots --

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
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

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
        if match[0].paper is not None:
          ax.plot((i + 0.3) * width, match[0].paper, label="paper", zorder=3,   # off the stem
                  **PAPER_MARKER)
      ax.set_xticks([i * width for i in range(len(names))], names, rotation=45)
      ax.set_ylabel(ylabel or metric, fontsize=9)
      ax.set_title(f"{g}: {metric}", fontsize=9)
  legend = {}   # one entry per label, from whichever panel has it
  for ax in axes[0]:
    for handle, label in zip(*ax.get_legend_handles_labels()):
      legend.setdefault(label, handle)
  if legend:
    axes[0, 0].legend(legend.values(), legend.keys(), fontsize=7, loc="lower right")
  fig.suptitle(f"{title}\nbars: ours (mean ± std, black error bars); hollow red diamonds: "
               f"the paper", fontsize=9)
  fig.tight_layout()
  return fig


def save_figure(fig: Any, path: str, dpi: int = 110) -> str:
  """Save a matplotlib figure as PNG (local or ``gs://…``), close it, return ``path``."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
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
