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

Preemption: ``SIGTERM`` sets a flag the loop polls
(:meth:`Checkpointer.preempted`); multi-process runs also ask Orbax's
``reached_preemption`` (JAX's preemption sync manager) so every process
stops at the same step. The loop then saves and exits cleanly.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import jax
import orbax.checkpoint as ocp


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
    """Save ``state`` (arrays), ``meta`` (JSON-able) and optionally ``best`` at ``step`` (async)."""
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
    """Block until pending async saves are on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self.wait()
    self.uninstall_sigterm_handler()
    self._manager.close()


def abstract_like(tree: Any, shardings: Any) -> Any:
  """``ShapeDtypeStruct`` s of ``tree`` carrying ``shardings`` (a restore target)."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)
