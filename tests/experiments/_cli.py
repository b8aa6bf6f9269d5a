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
# Fork servers (tests/experiments/_forkserver.py) by the JAX_* variables they were started with.
_SERVERS: dict[tuple[tuple[str, str], ...], subprocess.Popen] = {}


def _env(devices: int, shared_cache: bool, run_bound: bool = False) -> dict[str, str]:
  env = compile_cache.env(os.environ) if shared_cache else dict(os.environ)
  env["XLA_FLAGS"] = compile_cache.xla_flags(devices, run_bound)
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  return env


def run(module: str, *args: str, devices: int = 1, timeout: int = 600,
        check: bool = True, shared_cache: bool = True, run_bound: bool = False,
        **popen) -> subprocess.CompletedProcess:
  """``python -m experiments.<module> <args>`` to its end: its exit status, stdout and stderr.

  It runs as a fork of a server that has done the imports every experiment does, which
  then runs the module as ``python -m`` would: the module itself, its flags and everything
  after the imports fresh in each case (tests/experiments/_forkserver.py). That saves the
  interpreter's start and the imports, a few seconds a run. A server is started on
  first use, one per pytest process and set of ``JAX_*`` variables (:func:`_forked`).

  ``devices``: simulated CPU devices. ``timeout``: seconds before the run is killed
  (returncode -9). ``check``: raise unless it exits 0. ``shared_cache``: reuse the
  session's compiled programs (tests/compile_cache.py); False compiles them all.
  ``run_bound``: compile for a program whose steps take longer than compiling it
  (:data:`tests.compile_cache.RUN_BOUND`). ``popen``: ``subprocess.run`` keywords (e.g.
  ``preexec_fn``): then a process of its own, started as a user would.
  """
  if popen:
    env = _env(devices, shared_cache, run_bound)
    proc = subprocess.run([sys.executable, "-m", f"experiments.{module}", *args], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, **popen)
  else:
    proc = _forked(module, args, _env(devices, shared_cache, run_bound), timeout)
  if check and proc.returncode != 0:
    raise AssertionError(f"experiments.{module} exited {proc.returncode}:\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  return proc


def forked(module: str, *args: str, devices: int = 1,
           timeout: int = 600) -> subprocess.CompletedProcess:
  """:func:`run` with ``check=False``: for a process that should fail (a bad flag)."""
  return run(module, *args, devices=devices, timeout=timeout, check=False)


def _forked(module: str, args: Sequence[str], env: dict[str, str],
            timeout: int) -> subprocess.CompletedProcess:
  """``args`` run by a fork server, in ``env``. JAX reads its ``JAX_*`` variables when it is
  imported, so a server serves the runs whose ``JAX_*`` match its own; every other
  variable (``XLA_FLAGS``, read when the backend starts; ``TPU_LOG_DIR``) is the
  child's own."""
  key = tuple(sorted((k, v) for k, v in env.items() if k.startswith("JAX_")))
  server = _SERVERS.get(key)
  if server is None or server.poll() is not None:
    server = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "tests", "experiments", "_forkserver.py")],
        env=env, cwd=REPO, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _SERVERS[key] = server
    atexit.register(server.stdin.close)   # its loop ends, it exits
  args = [f"experiments.{module}", *args]
  server.stdin.write(json.dumps({"args": args, "timeout": timeout, "env": env}) + "\n")
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
