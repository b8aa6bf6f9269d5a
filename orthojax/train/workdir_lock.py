"""One writer per workdir: an exclusive lock held for the whole run.

Two runs writing one workdir corrupt each other's checkpoints and metrics
(both save the same steps; Orbax's temporary directories collide). The run
takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``<workdir>/run.lock`` before it
writes anything and keeps it until it ends; the kernel drops the lock when
the process dies, even by SIGKILL, so a crashed run never leaves a stale
lock behind. The file records who holds it (host, pid, start time) for the
one-line refusal a second run gets.

Only process 0 of a multi-process run takes it (the others write the same
workdir by design). ``flock`` works on local disks and on most network file
systems; on object stores (``gs://…``) there is nothing to lock — the run
says so once and goes on, and one run per workdir is then the launcher's job
(``launch/tpu_pod.sh`` refuses to start over a live run).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from typing import Any, Callable

import jax

from orthojax.train.config import ConfigError

LOCK_FILE = "run.lock"
_LOG = logging.getLogger(__name__)


class WorkdirLock:
  """``with WorkdirLock(workdir):`` — the run's exclusive hold on ``workdir``.

  ``print_fn(line)`` says where nothing can be locked (an object store); None: this
  module's logger, at INFO.

  Raises:
    ConfigError: another live run holds it (one line naming host and pid), or
      the workdir is not a writable directory.
  """

  def __init__(self, workdir: str | None, print_fn: Callable[[str], Any] | None = None):
    self.workdir = workdir or None
    self.print = _LOG.info if print_fn is None else print_fn
    self._fd: int | None = None

  def __enter__(self) -> "WorkdirLock":
    if self.workdir is None or jax.process_index() != 0:
      return self
    if "://" in self.workdir:
      self.print(f"Note: workdir {self.workdir} is an object store; runs there are not "
                 f"locked against each other")
      return self
    import fcntl  # pylint: disable=g-import-not-at-top  (POSIX only)
    path = os.path.join(self.workdir, LOCK_FILE)
    try:
      os.makedirs(self.workdir, exist_ok=True)
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
      raise ConfigError(f"workdir {self.workdir}: cannot write there ({e.strerror}); give a "
                        f"writable directory") from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      holder = os.read(fd, 4096).decode(errors="replace").strip() or "another process"
      os.close(fd)
      raise ConfigError(f"workdir {self.workdir}: in use by {holder}; one run per workdir "
                        f"(wait for it, stop it, or choose another workdir)") from None
    os.ftruncate(fd, 0)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {started}\n".encode())
    self._fd = fd
    return self

  def __exit__(self, *exc: Any) -> None:
    if self._fd is not None:
      os.close(self._fd)   # closing releases the flock
      self._fd = None
