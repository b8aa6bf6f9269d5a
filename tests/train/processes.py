"""Start several cooperating processes (a multi-process jax run) and wait for all of them."""

from __future__ import annotations

import subprocess
import time
from typing import Sequence


def run_together(commands: Sequence[Sequence[str]], envs: Sequence[dict], cwd: str, logdir,
                 timeout: float = 300) -> None:
  """Run ``commands`` at once; assert every one exits 0, showing their output tails if not.

  Output goes to files, not pipes: a full pipe would block one process inside a
  collective and so hang the others. When one fails the others are killed (they
  would wait for it forever).
  """
  logs = [open(logdir / f"process{i}.log", "w+") for i in range(len(commands))]
  procs = [subprocess.Popen(list(cmd), env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
           for cmd, env, log in zip(commands, envs, logs)]
  deadline = time.time() + timeout
  while time.time() < deadline and any(p.poll() is None for p in procs):
    if any(p.poll() not in (None, 0) for p in procs):
      break
    time.sleep(0.5)
  for p in procs:
    if p.poll() is None:
      p.kill()
      p.wait()
  outs = []
  for log in logs:
    log.seek(0)
    outs.append(log.read()[-3000:])
    log.close()
  assert all(p.returncode == 0 for p in procs), outs
