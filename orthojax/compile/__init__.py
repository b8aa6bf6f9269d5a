"""What a job costs before it runs: compile it for a topology and read the executable.

One floor above :mod:`orthojax.train`: it builds a run's program with the
trainer's own code and compiles it for accelerators the machine does not have,
so a pod job's memory and FLOPs are known before a chip is booked.

* :mod:`~orthojax.compile.topology` — accelerator topologies without the
  accelerators (``v5e:8x8``, ``h100:1x1x8``): abstract devices and each chip's
  published peak FLOP/s, HBM and bandwidth.
* :mod:`~orthojax.compile.aot` — :func:`~orthojax.compile.aot.compile_for`, the
  pod compile check: per-chip HBM against the chip's, FLOPs and bytes per step,
  collectives, a roofline bound, and one line when the job does not fit.
* :mod:`~orthojax.compile.hlo` — reading a compiled executable's optimized HLO:
  loop trip counts, matmul and LAPACK FLOPs, collectives, traffic by name scope,
  guarded conditionals at their cheapest branch.

Imported on its own (``from orthojax.compile import aot``), like
:mod:`orthojax.train`, which it brings with it; nothing in the library below
imports it.
"""

from orthojax.compile import aot
from orthojax.compile import hlo
from orthojax.compile import topology

__all__ = ["aot", "hlo", "topology"]
