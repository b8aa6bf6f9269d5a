"""Run an experiment module as a user would: ``python -m experiments.<name> …``."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from typing import Sequence

from tests import compile_cache

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SERVERS: dict[int, subprocess.Popen] = {}   # by device count: tests/experiments/_forkserver.py


def _env(devices: int, shared_cache: bool, run_bound: bool = False) -> dict[str, str]:
  env = compile_cache.env(os.environ) if shared_cache else dict(os.environ)
  env["XLA_FLAGS"] = compile_cache.xla_flags(devices, run_bound)
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  return env


def run(module: str, *args: str, devices: int = 1, timeout: int = 600,
        check: bool = True, shared_cache: bool = True, run_bound: bool = False,
        **popen) -> subprocess.CompletedProcess:
  """``popen``: more ``subprocess.run`` keywords (e.g. ``preexec_fn``). ``shared_cache``:
  reuse the session's compiled programs (tests/compile_cache.py); False compiles them all.
  ``run_bound``: compile for a program whose steps take longer than compiling it
  (:data:`tests.compile_cache.RUN_BOUND`)."""
  env = _env(devices, shared_cache, run_bound)
  proc = subprocess.run([sys.executable, "-m", f"experiments.{module}", *args], env=env,
                        cwd=REPO, capture_output=True, text=True, timeout=timeout, **popen)
  if check and proc.returncode != 0:
    raise AssertionError(f"experiments.{module} exited {proc.returncode}:\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  return proc


def forked(module: str, *args: str, devices: int = 1,
           timeout: int = 600) -> subprocess.CompletedProcess:
  """:func:`run` (``check=False``) for a process that stops soon after its imports (a bad
  flag): a fork of a server that has done the imports every experiment does, which then
  runs the module as ``python -m`` would — the module itself, its flags and everything
  after the imports fresh in each case (tests/experiments/_forkserver.py). About ten
  times faster than :func:`run` when the imports are most of the cost."""
  server = _SERVERS.get(devices)
  if server is None or server.poll() is not None:
    server = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "tests", "experiments", "_forkserver.py")],
        env=_env(devices, shared_cache=True), cwd=REPO, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _SERVERS[devices] = server
    atexit.register(server.stdin.close)   # its loop ends, it exits
  args = [f"experiments.{module}", *args]
  server.stdin.write(json.dumps({"args": args, "timeout": timeout}) + "\n")
  server.stdin.flush()
  reply = server.stdout.readline()
  if not reply:
    raise AssertionError(f"tests/experiments/_forkserver.py exited {server.wait()}:\n"
                         f"{server.stderr.read()[-3000:]}")
  reply = json.loads(reply)
  return subprocess.CompletedProcess([sys.executable, "-m", *args], reply["returncode"],
                                     reply["stdout"], reply["stderr"])


def run_each(module: str, commands: Sequence[Sequence[str]], *, devices: int = 1,
             timeout: int = 600) -> list[subprocess.CompletedProcess]:
  """:func:`forked` for each of ``commands`` (argument lists), one after the other."""
  return [forked(module, *command, devices=devices, timeout=timeout) for command in commands]
