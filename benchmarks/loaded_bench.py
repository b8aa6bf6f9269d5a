"""The QR steps on a loaded machine: a second job on every core, against idle.

On a small shared CPU, LAPACK threads that outnumber the free cores can make a QR step
collapse under load (a 32 × 400 × 400 QR 36× slower with the machine busy). This suite times
orthojax's QR-retraction steps (Riemannian Adam and SGD with momentum, the retraction
by one CholeskyQR pass, the default, and by Householder QR) on the stacks of the peers suite, idle and
with a second job running: ``os.cpu_count()`` processes spinning on a Python loop at
the same priority, paused (SIGSTOP) for the idle rounds. Idle and loaded rounds
alternate; each time is the median of its rounds.

Target (CPU): a loaded step at most 1.5× the idle step. A fair scheduler gives each of
two equal jobs half the machine, so a step that used every core fully would take 2×;
the bound asks that the step lose no more than its share of parallelism, and never
fall into the oversubscribed regime where waiting threads make it many times slower.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Callable, Iterator

import jax

from benchmarks import _peers_data
from benchmarks import peers_bench
from benchmarks._harness import Row
from benchmarks._harness import Target
from benchmarks._harness import ratio
from benchmarks._harness import row

SUITE = "loaded"
BOUND = Target("<=", 1.5, backends=("cpu",))
_SPIN = "while True:\n    pass\n"


@contextlib.contextmanager
def _second_job() -> Iterator[Callable[[bool], None]]:
  """Spinning processes, one per core; yields ``set_running(bool)``."""
  procs = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(os.cpu_count() or 1)]

  def set_running(running: bool) -> None:
    for p in procs:
      p.send_signal(signal.SIGCONT if running else signal.SIGSTOP)
    time.sleep(0.5)   # let the scheduler settle

  try:
    set_running(False)
    yield set_running
  finally:
    for p in procs:
      p.kill()
      p.wait()


def run(quick: bool = False) -> list[Row]:
  if jax.default_backend() != "cpu":
    return [row(SUITE, "skipped", float("nan"), "", note="CPU only")]
  shapes = [(8, 200, 200)] if quick else [(32, 400, 400), (32, 1024, 256)]
  rounds, calls = (2, 2) if quick else (4, 3)
  rows = []
  with _second_job() as set_running:
    for shape in shapes:
      w, g = _peers_data.optimizer_case(shape)
      steps = {}
      for kind in ("radam_qr", "rsgd_qr"):
        for algorithm in ("cholesky_qr", "householder"):
          timed = peers_bench._timed(peers_bench._orthojax_step(
              peers_bench._orthojax_optimizer(kind, algorithm), w, g))
          timed()   # compile
          steps[f"{kind} {algorithm}"] = timed
      times: dict[tuple[str, bool], list[float]] = {}
      loads = []
      for _ in range(rounds):
        for loaded in (False, True):
          set_running(loaded)
          for _ in range(calls):
            for name, timed in steps.items():
              times.setdefault((name, loaded), []).append(timed())
          if loaded:
            loads.append(os.getloadavg()[0])
      set_running(False)
      label = f"{shape[0]} x {shape[1]}x{shape[2]}"
      for name in steps:
        idle, busy = (statistics.median(times[(name, b)]) for b in (False, True))
        rows.append(row(SUITE, f"{name} step, {label}, idle", 1e3 * idle, "ms"))
        rows.append(row(SUITE, f"{name} step, {label}, loaded", 1e3 * busy, "ms"))
        rows.append(row(SUITE, f"{name} step, {label}: loaded / idle", ratio(busy, idle), "x",
                        BOUND, note=f"{os.cpu_count()} spinning processes; 1-minute load "
                                    f"{max(loads):.1f} at most while loaded; OPENBLAS_NUM_THREADS="
                                    f"{os.environ.get('OPENBLAS_NUM_THREADS', 'default')}"))
  return rows
