"""Orbax checkpoints: async, every N steps, keep K, at preemption; resume anywhere.

A checkpoint holds two items:

* ``state`` — the train state pytree (params, model state such as BatchNorm
  statistics, optimizer state incl. reduce-on-plateau, step, RNG key data),
  saved with ``StandardSave`` from sharded ``jax.Array`` s;
* ``meta`` — JSON: the data position (batches consumed), early-stopping
  bookkeeping and the config, so a resumed run continues exactly;
* ``best`` (only with ``--restore_best``) — the train state at the best
  evaluation so far.

Orbax writes each step to a temporary directory and renames it when
complete, so a crash mid-save (even ``kill -9``) leaves the previous
checkpoints intact and the partial one invisible. Restoring takes an
*abstract* target whose leaves carry the shardings of the current mesh, so a
checkpoint written on 8 devices restores on 4 or on 1.

Integrity: Orbax checks no checksum, so a flipped bit restores silently. Once
a step's save has finished, a manifest of the CRC-32 of every file in its
directory is written beside the checkpoints
(``<directory>/../checkpoint_checksums/<step>.json``). A resume takes the newest
step whose files all match their manifest; a damaged, incomplete or
unverified newer step is reported in one line each and passed over, and is
left on disk untouched for inspection (the next saves move past it). A step
is only ever called intact after that check.

Preemption: ``SIGTERM`` sets a flag the loop polls
(:meth:`Checkpointer.preempted`); multi-process runs also ask Orbax's
``reached_preemption`` (JAX's preemption sync manager) so every process
stops at the same step. The loop then saves and exits cleanly.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import zlib
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from etils import epath

_LOG = logging.getLogger(__name__)


def _digest(path: epath.Path) -> str:
  """The file's CRC-32 (zlib's), as ``crc32:<8 hex digits>``.

  A check against accidental damage, as GCS objects, zip archives and TFRecords carry:
  it catches every error burst up to 32 bits long and any other with probability
  1 − 2⁻³². Not a cryptographic hash, deliberately: on a 2-core Xeon without SHA
  extensions zlib's CRC-32 reads 1.8 GB/s where SHA-256 reads 0.23 GB/s, and a ResNet-50
  checkpoint with its best state (0.4 GB) is checked at every save and every resume.
  """
  crc = 0
  with path.open("rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      crc = zlib.crc32(block, crc)
  return f"crc32:{crc:08x}"


def _files(step_dir: epath.Path) -> dict[str, epath.Path]:
  """Every file under ``step_dir`` by its relative path (a walk with ``iterdir``:
  etils refuses recursive globs, which cost thousands of requests on GCS)."""
  out, stack = {}, [step_dir]
  while stack:
    for path in stack.pop().iterdir():
      if path.is_dir():
        stack.append(path)
      else:
        out[os.fspath(path.relative_to(step_dir))] = path
  return out


class Checkpointer:
  """A thin, opinionated ``ocp.CheckpointManager``.

  Args:
    directory: where step directories go (created).
    every_steps: periodic save interval (0: only at preemption / the end).
    keep: how many checkpoints to keep.
    async_save: save in a background thread (the step loop goes on).
  """

  def __init__(self, directory: str, *, every_steps: int, keep: int = 3, async_save: bool = True):
    if keep < 1:
      raise ValueError(f"checkpoint keep={keep} must be >= 1")
    self.directory = os.path.abspath(directory)
    self.every_steps = every_steps
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=async_save,
        save_interval_steps=1)
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    self._checksums = epath.Path(self.directory).parent / "checkpoint_checksums"
    self._sigterm = threading.Event()
    self._previous_handler = None

  # Preemption -------------------------------------------------------------

  def install_sigterm_handler(self) -> None:
    """SIGTERM → :meth:`preempted` becomes true (main thread only; else a no-op)."""
    if threading.current_thread() is not threading.main_thread():
      return
    self._previous_handler = signal.signal(signal.SIGTERM, lambda *_: self._sigterm.set())

  def uninstall_sigterm_handler(self) -> None:
    if self._previous_handler is not None:
      signal.signal(signal.SIGTERM, self._previous_handler)
      self._previous_handler = None

  def preempted(self, step: int) -> bool:
    if jax.process_count() > 1:
      return self._manager.reached_preemption(step)
    return self._sigterm.is_set()

  # Save / restore ---------------------------------------------------------

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def should_save(self, step: int) -> bool:
    return self.every_steps > 0 and step > 0 and step % self.every_steps == 0

  def save(self, step: int, state: Any, meta: dict[str, Any], best: Any = None) -> None:
    """Save ``state`` (arrays), ``meta`` (JSON-able) and optionally ``best`` at ``step`` (async).

    The previous save is finished and its checksums written first.
    """
    self.wait()
    items = dict(state=ocp.args.StandardSave(state),
                 meta=ocp.args.JsonSave({**meta, "has_best": best is not None}))
    if best is not None:
      items["best"] = ocp.args.StandardSave(best)
    self._manager.save(step, args=ocp.args.Composite(**items), force=True)

  def meta(self, step: int) -> dict[str, Any]:
    """The JSON item of ``step`` alone (cheap: no arrays are read)."""
    return dict(self._manager.restore(step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore())).meta)

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
    """Restore ``step`` onto ``abstract_state``'s shapes, dtypes and shardings.

    Returns ``(state, meta)``; when the checkpoint holds a ``best`` state it
    is restored onto the same target and returned as ``meta["best_state"]``.
    """
    meta = self.meta(step)
    items = dict(state=ocp.args.StandardRestore(abstract_state))
    if meta.pop("has_best", False):
      items["best"] = ocp.args.StandardRestore(abstract_state)
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    if "best" in items:
      meta["best_state"] = restored.best
    return restored.state, meta

  def wait(self) -> None:
    """Block until pending async saves are on disk, then write their checksums."""
    self._manager.wait_until_finished()
    if jax.process_index() == 0:
      for step in self.all_steps():
        manifest = self._checksums / f"{step}.json"
        if not manifest.exists():
          step_dir = epath.Path(self.directory) / str(step)
          digests = {name: _digest(path) for name, path in sorted(_files(step_dir).items())}
          self._checksums.mkdir(parents=True, exist_ok=True)
          tmp = manifest.with_name(manifest.name + ".tmp")
          tmp.write_text(json.dumps(digests, indent=0))
          tmp.replace(manifest)

  def damage(self, step: int) -> str | None:
    """Why ``step`` cannot be trusted (one phrase), or None when every file matches."""
    manifest = self._checksums / f"{step}.json"
    if not manifest.exists():
      return "no checksums were written for it (its save did not finish)"
    try:
      expected = json.loads(manifest.read_text())
    except ValueError:
      return "its checksum manifest is unreadable"
    found = _files(epath.Path(self.directory) / str(step))
    for name, digest in expected.items():
      if name not in found:
        return f"{name} is missing"
      if _digest(found[name]) != digest:
        return f"{name} does not match its checksum"
    return None

  def latest_intact_step(self, print_fn: Callable[[str], Any] | None = None) -> int | None:
    """The newest step whose files all match their checksums (None: no step saved).

    Each newer step passed over is reported in one line (``print_fn(line)``; None: this
    module's logger, at WARNING) and moved to ``checkpoints_unusable/`` beside the
    checkpoints, out of the way of the saves to come.

    Raises:
      ValueError: steps exist but none is intact (nothing is moved then).
    """
    print_fn = _LOG.warning if print_fn is None else print_fn
    passed_over = []
    found = None
    for step in sorted(self.all_steps(), reverse=True):
      why = self.damage(step)
      if why is None:
        found = step
        break
      print_fn(f"Checkpoint step {step} in {self.directory} is not usable: {why}; "
               f"trying an older one")
      passed_over.append(step)
    if passed_over and found is None:
      raise ValueError(f"no checkpoint in {self.directory} is intact; move it away to start "
                       f"the run over")
    for step in passed_over:
      self._set_aside(step, print_fn)
    return found

  def _set_aside(self, step: int, print_fn: Callable[[str], Any]) -> None:
    """Move an unusable step out of the way of the saves to come (kept for inspection)."""
    aside = epath.Path(self.directory).parent / "checkpoints_unusable"
    if jax.process_index() == 0:
      aside.mkdir(parents=True, exist_ok=True)
      target = aside / str(step)
      n = 1
      while target.exists():
        target, n = aside / f"{step}.{n}", n + 1
      (epath.Path(self.directory) / str(step)).rename(target)
      manifest = self._checksums / f"{step}.json"
      if manifest.exists():
        manifest.rename(target.with_name(target.name + ".checksums.json"))
      print_fn(f"  moved to {target}")
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices(f"orthojax set aside checkpoint {step}")
    self._manager.reload()

  def close(self) -> None:
    self.wait()
    self.uninstall_sigterm_handler()
    self._manager.close()


def abstract_like(tree: Any, shardings: Any) -> Any:
  """``ShapeDtypeStruct`` s of ``tree`` carrying ``shardings`` (a restore target)."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)
