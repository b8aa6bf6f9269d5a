"""The command line: ``--config`` with its overrides, the shared flags, one-line errors."""

from __future__ import annotations

import logging
import os
import pathlib
import sys
from typing import Any, Callable, NoReturn, Sequence

from absl import app
from absl import flags
import jax
from ml_collections import config_dict as mlc_dict
from ml_collections import config_flags
from ml_collections.config_flags import config_flags as mlc_flags

from orthojax.train import overrides as overrides_lib
from orthojax.train import registry
from orthojax.train.config import Config
from orthojax.train.config import ConfigError
from orthojax.train.data import DatasetNotFoundError
from orthojax.train.trainer import NonFiniteLossError

CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"
_LOAD_ERRORS = (AttributeError, KeyError, TypeError, ValueError, OSError)
_OVERRIDES: list[str] = []   # the --config.KEY=VALUE arguments, in order, flagfiles expanded


def define_flags(default_config: str = "train.py") -> None:
  """``--config`` (an ``experiments/configs`` file, default ``default_config``),
  ``--workdir``, ``--config_help``, the multi-process flags and the shared ones."""
  if "config" in flags.FLAGS:
    return
  try:
    config_flags.DEFINE_config_file(
        "config", str(CONFIGS / default_config),
        "The training config: a Python file whose get_config(arg) returns an ml_collections "
        "ConfigDict with the keys of orthojax.train.Config (experiments/configs/*.py), "
        "optionally FILE:arg (e.g. e1_resnet50.py:gmp_imn); override any key with "
        "--config.key=value (--config.optimizer.euclidean.learning_rate=0.1). --config_help "
        "prints the config and every model / optimizer / manifold a section may name.",
        lock_config=True, sys_argv=sys.argv[:1])   # overrides: ours (orthojax.train.overrides)
  except (*_LOAD_ERRORS, config_flags.config_flags.UnsupportedOperationError) as e:
    _fail_to_load(e, sys.argv)   # the default config file does not load
  flags.DEFINE_string("workdir", "", "Output directory: checkpoints, metrics.jsonl, "
                      "TensorBoard files, results and the report. Rerunning resumes there.")
  flags.DEFINE_bool("config_help", False, "Print the config (after overrides) and the "
                    "constructors its sections may name, with their keywords, and exit.")
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
                       "experiment's default.", lower_bound=0)
  flags.DEFINE_string("compile_for", "", "Pod compile check: compile the exact train and eval "
                      "steps for this TPU topology (e.g. v5e:8x8, v4:2x2x4; with "
                      "--config.mesh.num_slices for multi-slice) with libtpu, without TPUs or "
                      "data; print the per-chip HBM, FLOPs, collectives and roofline, write "
                      "compile_report.json to --workdir, and stop (exit 1 if it does not fit).")


class _ListParser(flags.ArgumentParser):
  """A comma-separated list of ``kind`` values, each one checked; absl reports a bad one
  as ``flag --NAME=VALUE: why`` (one line from :func:`parse_flags`)."""

  syntactic_help = "a comma-separated list"

  def __init__(self, kind: type, choices: Sequence[Any], check: Callable[[Any], bool] | None,
               requirement: str, unique: bool):
    self.kind, self.choices, self.check, self.requirement = kind, choices, check, requirement
    self.unique = unique

  def parse(self, argument: str | list[Any]) -> list[Any]:
    items = argument if isinstance(argument, list) else [
        a.strip() for a in argument.split(",") if a.strip()]
    if not items:
      raise ValueError("empty" + (f"; choose from {', '.join(map(str, self.choices))}"
                                  if self.choices else ""))
    out = []
    for item in items:
      try:
        value = self.kind(item)
      except ValueError:
        raise ValueError(f"{item!r} is not {'an integer' if self.kind is int else 'a number'}"
                         ) from None
      if self.choices and value not in self.choices:
        raise ValueError(f"unknown {item!r}; choose from {', '.join(map(str, self.choices))}")
      if self.check is not None and not self.check(value):
        raise ValueError(f"{item} {self.requirement}")
      if self.unique and value in out:
        raise ValueError(f"{item} is repeated")
      out.append(value)
    return out

  def flag_type(self) -> str:
    return f"list of {self.kind.__name__}"


def define_list(name: str, default: Sequence[Any], help_text: str, *, kind: type = str,
                choices: Sequence[Any] = (), check: Callable[[Any], bool] | None = None,
                requirement: str = "", unique: bool = False) -> flags.FlagHolder:
  """A comma-separated list flag whose items are ``kind`` values, in ``choices`` when
  given, pass ``check`` (else ``requirement`` is the error, e.g. ``"must be > 0"``) and,
  if ``unique``, differ."""
  return flags.DEFINE(_ListParser(kind, choices, check, requirement, unique), name,
                      ",".join(map(str, default)), help_text,
                      serializer=flags.CsvListSerializer(","))


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing, with a bad flag as one line (absl prints two) and exit 2.

  The ``--config.KEY=VALUE`` overrides (flagfiles expanded) are kept aside and applied
  by :func:`config_dict` with :mod:`orthojax.train.overrides`, which can also switch a
  section's constructor and create a section the file leaves None."""
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
    cause, text = e.__cause__ or e.__context__, str(e)
    if (cause is not None and not isinstance(cause, flags.Error)   # a flag's own value
        and (not text.startswith("flag --") or text.startswith("flag --config="))):
      _fail_to_load(cause, argv)
    fail(" ".join(text.removeprefix("flag ").split("\n")[0].split()))
  except (*_LOAD_ERRORS, mlc_flags.UnsupportedOperationError) as e:
    _fail_to_load(e, argv)


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
  app.run(main, flags_parser=parse_flags)


def echo(line: str) -> None:
  """The experiments' console: ``line`` on stdout, flushed (a pipe sees it at once)."""
  print(line, flush=True)


class _Stdout(logging.Handler):
  """Log records as plain lines on the current ``sys.stdout`` (:func:`echo`)."""

  def emit(self, record: logging.LogRecord) -> None:
    try:
      echo(self.format(record))
    except Exception:  # pylint: disable=broad-except  (logging's own convention)
      self.handleError(record)


def show_progress() -> None:
  """Show orthojax's console lines (Python logging, logger ``orthojax``: a run's progress,
  resume and warnings) on stdout as plain lines, as the experiments always printed them,
  whatever absl's ``--verbosity`` leaves of the other libraries' logs (on stderr). Once per
  process; repeated calls change nothing."""
  logger = logging.getLogger("orthojax")
  logger.setLevel(logging.INFO)
  logger.propagate = False   # not also through absl's handler (stderr, with a prefix)
  if not any(isinstance(h, _Stdout) for h in logger.handlers):
    logger.addHandler(_Stdout())


def check_workdir(workdir: str) -> None:
  """One line and exit 2 when ``--workdir`` cannot hold the experiment — a file, under a
  file, or in a directory this process may not write — before any work (nothing is
  created here). Cloud paths (``gs://…``) are checked by their first write."""
  if not workdir or "://" in workdir:
    return
  path = pathlib.Path(workdir).absolute()
  existing = next(p for p in (path, *path.parents) if p.exists())
  if not existing.is_dir():
    fail(f"--workdir={workdir}: {'is' if existing == path else 'lies under'} a file "
         f"({existing}), not a directory; give a directory")
  if not os.access(existing, os.W_OK | os.X_OK):
    fail(f"--workdir={workdir}: cannot write in {existing} (permission denied); give a "
         f"directory you can write")


def config_from_flags(fv: flags.FlagValues = flags.FLAGS) -> Config:
  """The :class:`Config` of ``--config`` (+ overrides) and ``--workdir`` (not validated)."""
  tree = config_dict()
  if "workdir" in tree:
    raise ConfigError("config.workdir: set the workdir with --workdir, not in the config")
  return Config.from_dict({**tree, "workdir": fv.workdir})


def print_config_help(config: Config) -> None:
  """``--config_help``: the checked config and every constructor a section may name."""
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


def fail(message: str) -> NoReturn:
  """Stop with ``error: <message>`` on one line of stderr and exit status 2."""
  print(f"error: {message}", file=sys.stderr)
  raise SystemExit(2)


def fail_on_config_error(fn: Callable[[], Any]) -> Any:
  """``fn()``, turning a :class:`ConfigError` or a missing dataset into :func:`fail`
  (exit 2) and a run stopped by its non-finite guard into one line and exit 1."""
  try:
    return fn()
  except (ConfigError, DatasetNotFoundError) as e:   # missing data: what to do (ImageNet: steps)
    fail(str(e))
  except NonFiniteLossError as e:
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(1) from None


def compile_only() -> bool:
  """Whether ``--compile_for`` asks to compile the runs instead of training them."""
  return bool(flags.FLAGS.compile_for)


def num_seeds(default: int) -> int:
  """``--num_seeds``, or ``default`` when it is 0."""
  return flags.FLAGS.num_seeds or default


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
  """Whether this process writes the experiment's files (process 0)."""
  return jax.process_index() == 0
