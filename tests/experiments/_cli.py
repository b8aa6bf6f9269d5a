"""Run an experiment module as a user would: ``python -m experiments.<name> …``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Sequence

from tests import compile_cache

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(devices: int, shared_cache: bool) -> dict[str, str]:
  env = compile_cache.env(os.environ) if shared_cache else dict(os.environ)
  env["XLA_FLAGS"] = compile_cache.xla_flags(devices)
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  return env


def run(module: str, *args: str, devices: int = 1, timeout: int = 600,
        check: bool = True, shared_cache: bool = True,
        **popen) -> subprocess.CompletedProcess:
  """``popen``: more ``subprocess.run`` keywords (e.g. ``preexec_fn``). ``shared_cache``:
  reuse the session's compiled programs (tests/compile_cache.py); False compiles them all."""
  proc = subprocess.run([sys.executable, "-m", f"experiments.{module}", *args],
                        env=_env(devices, shared_cache), cwd=REPO, capture_output=True,
                        text=True, timeout=timeout, **popen)
  if check and proc.returncode != 0:
    raise AssertionError(f"experiments.{module} exited {proc.returncode}:\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  return proc


# One process imports what every experiment imports (jax, flax, orthojax, the harness:
# most of a start that fails on its flags), then forks once per command line; each child
# runs the module as ``python -m`` would (runpy, ``__main__``, fresh flags) with its
# stdout and stderr in files. Nothing has touched a jax backend before the fork.
_FORKED = textwrap.dedent("""
    import json, os, runpy, sys, traceback
    module, commands, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    import experiments._harness  # noqa: F401  (the shared imports, before the forks)
    path = os.path.join(os.getcwd(), "experiments", module + ".py")
    for i, args in enumerate(commands):
      sys.stdout.flush(); sys.stderr.flush()
      pid = os.fork()
      if pid == 0:
        for fd, name in ((1, "stdout"), (2, "stderr")):
          f = os.open(os.path.join(out, f"{i}.{name}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
          os.dup2(f, fd); os.close(f)
        sys.argv = [path, *args]
        code = 0
        try:
          runpy.run_module("experiments." + module, run_name="__main__", alter_sys=True)
        except SystemExit as e:
          code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
          if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
        except BaseException:
          traceback.print_exc()
          code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
      _, status = os.waitpid(pid, 0)
      with open(os.path.join(out, f"{i}.rc"), "w") as f:
        f.write(str(os.waitstatus_to_exitcode(status)))
""")


def run_each(module: str, commands: Sequence[Sequence[str]], tmp_path, *, devices: int = 1,
             timeout: int = 600) -> list[subprocess.CompletedProcess]:
  """Each of ``commands`` (argument lists) as ``python -m experiments.<module> ARGS``, one
  after the other, for checks of how a command line fails (exit status, stdout, stderr):
  the shared imports are paid once, each command runs in a fresh forked process. The
  outputs go to ``tmp_path``."""
  out = tmp_path / f"run_each_{module}"
  out.mkdir()
  proc = subprocess.run([sys.executable, "-c", _FORKED, module,
                         json.dumps([list(c) for c in commands]), str(out)],
                        env=_env(devices, True), cwd=REPO, capture_output=True, text=True,
                        timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [subprocess.CompletedProcess(
      [sys.executable, "-m", f"experiments.{module}", *command],
      int((out / f"{i}.rc").read_text()), (out / f"{i}.stdout").read_text(),
      (out / f"{i}.stderr").read_text()) for i, command in enumerate(commands)]
