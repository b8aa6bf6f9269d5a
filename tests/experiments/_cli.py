"""Run an experiment module as a user would: ``python -m experiments.<name> …``."""

from __future__ import annotations

import os
import subprocess
import sys

from tests import compile_cache

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(module: str, *args: str, devices: int = 1, timeout: int = 600,
        check: bool = True, shared_cache: bool = True,
        **popen) -> subprocess.CompletedProcess:
  """``popen``: more ``subprocess.run`` keywords (e.g. ``preexec_fn``). ``shared_cache``:
  reuse the session's compiled programs (tests/compile_cache.py); False compiles them all."""
  env = compile_cache.env(os.environ) if shared_cache else dict(os.environ)
  env["XLA_FLAGS"] = compile_cache.xla_flags(devices)
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run([sys.executable, "-m", f"experiments.{module}", *args], env=env,
                        cwd=REPO, capture_output=True, text=True, timeout=timeout, **popen)
  if check and proc.returncode != 0:
    raise AssertionError(f"experiments.{module} exited {proc.returncode}:\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  return proc
