"""``python -m experiments.<name> …`` many times, without paying the imports each time.

Run as a script by :func:`tests.experiments._cli.run` (never imported by a test). It
imports what every experiment imports (``experiments._harness``: JAX, Flax, Optax, the
library), then answers requests on stdin, one JSON line each (``{"args": [module, …],
"timeout": s, "env": {…}}``): it forks, and the child does what ``python -m`` does from
there in that environment — runs the module fresh as ``__main__`` with that
``sys.argv`` (its flags defined anew, its stdout and stderr in files of its own) and
exits as that process would (atexit handlers included). The reply, one JSON line on stdout: the exit status, stdout and
stderr, each stream after what the imports here wrote to it (a warning at import time
counts in every case, as it would in a process of its own).

A fork is only that faithful while the process holds one thread and no JAX backend, so
the server checks both after the imports and refuses to start otherwise.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import signal
import sys
import tempfile
import threading
import time
import traceback


def _capture() -> tuple[int, int]:
  """Point fds 1 and 2 at fresh temporary files; return them (unlinked, still open)."""
  sys.stdout.flush()
  sys.stderr.flush()
  fds = []
  for fd in (1, 2):
    out, path = tempfile.mkstemp()
    os.unlink(path)
    os.dup2(out, fd)
    fds.append(out)
  return fds[0], fds[1]


def _read(fd: int) -> str:
  os.lseek(fd, 0, os.SEEK_SET)
  chunks = []
  while chunk := os.read(fd, 1 << 16):
    chunks.append(chunk)
  os.close(fd)
  return b"".join(chunks).decode(errors="replace")


def _child(module: str, args: list[str], env: dict[str, str] | None) -> None:
  """Become ``python -m <module> <args>`` in ``env`` (None: the server's); never returns
  (the interpreter exits)."""
  if env is not None:   # read after the imports: XLA_FLAGS when the backend starts, …
    os.environ.clear()
    os.environ.update(env)
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  os.close(null)
  sys.argv = [module, *args]   # run_module puts the module's path first, as -m does
  runpy.run_module(module, run_name="__main__", alter_sys=True)
  sys.exit(0)


def _wait(pid: int, timeout: float) -> int:
  """The child's exit status as ``subprocess`` gives it (``-N``: killed by signal N)."""
  deadline = time.monotonic() + timeout
  while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
      return os.waitstatus_to_exitcode(status)
    if time.monotonic() > deadline:
      os.kill(pid, signal.SIGKILL)
    time.sleep(0.01)


def main() -> None:
  sys.path[0] = os.getcwd()   # as python -m sets it
  requests, reply, errors = os.dup(0), os.dup(1), os.dup(2)
  import_out, import_err = _capture()
  try:
    import experiments._harness  # pylint: disable=g-import-not-at-top,unused-import
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    if threading.active_count() != 1 or xla_bridge.backends_are_initialized():
      raise RuntimeError("the imports started a thread or a JAX backend: forking is unsafe")
  except BaseException:  # pylint: disable=broad-except  (told to the caller, then exit 1)
    os.write(errors, (_read(import_err) + traceback.format_exc()).encode())
    sys.exit(1)
  imported = _read(import_out), _read(import_err)
  gc.freeze()   # the imports' objects: a child's exit does not walk (and copy) them all
  answers = os.fdopen(reply, "w")
  for line in os.fdopen(requests):   # no with: a child unwinds through here as it exits
    request = json.loads(line)
    out, err = _capture()
    pid = os.fork()
    if pid == 0:
      _child(request["args"][0], request["args"][1:], request.get("env"))
    returncode = _wait(pid, request["timeout"])
    answers.write(json.dumps({"returncode": returncode, "stdout": imported[0] + _read(out),
                              "stderr": imported[1] + _read(err)}) + "\n")
    answers.flush()


if __name__ == "__main__":
  main()
