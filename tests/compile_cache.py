"""How the tests compile: XLA:CPU at LLVM optimization level 0, and one persistent XLA
compilation cache for the programs a test session runs as subprocesses.

The suite's programs are small and run a few steps, so compiling is most of its time:
:data:`FAST_COMPILE` (``--xla_backend_optimization_level=0``, the LLVM backend's ``-O0``)
halves it. XLA's HLO passes (fusion, layout, algebraic simplification) still run and
fast-math stays off, so a program's numbers agree with the default build's to the last
bit or two (an element-wise function's code may differ, e.g. in fused multiply-adds);
a test that compares bit for bit compares two programs compiled alike (jitted with
jitted), not a jitted program with eager operations. ``tests/conftest.py`` adds it to the pytest processes' ``XLA_FLAGS``,
:func:`xla_flags` to their subprocesses'. The benchmarks and the experiments themselves
run at XLA's default level.

Many tests start the same training program in fresh processes (an experiment's smoke run
and its rerun, a run killed and resumed, two entry points on one workdir); each process
would compile the same XLA programs again. ``tests/conftest.py`` makes one cache
directory per session (shared by the pytest-xdist workers) and names it in
:data:`VAR`; :func:`env` points a subprocess's JAX at it. The pytest processes
themselves do not use it: their tests compile in-process as a user's code would.
A test that must compile every program itself (e.g. to compare two compilations)
starts its subprocess without :func:`env`.
"""

from __future__ import annotations

import os

VAR = "ORTHOJAX_TEST_COMPILATION_CACHE"
FAST_COMPILE = "--xla_backend_optimization_level=0"


def xla_flags(devices: int) -> str:
  """``XLA_FLAGS`` for a test's subprocess: ``devices`` simulated CPU devices, compiled
  as the pytest processes compile (:data:`FAST_COMPILE`)."""
  return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"


def env(base: dict[str, str]) -> dict[str, str]:
  """``base`` with JAX's persistent compilation cache set to the session's directory
  (every program cached, however quickly it compiled); unchanged where the session has
  none or ``base`` names its own."""
  path = os.environ.get(VAR)
  if not path or "JAX_COMPILATION_CACHE_DIR" in base:
    return dict(base)
  return {**base, "JAX_COMPILATION_CACHE_DIR": path,
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
