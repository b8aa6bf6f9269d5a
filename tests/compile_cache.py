"""How the tests compile: XLA:CPU's quickest compiler settings, and one persistent XLA
compilation cache per test session.

The suite's programs are small and run a few steps, so compiling is most of its time
(about two thirds of a worker's wall time, by JAX's compile events). :data:`FAST_COMPILE`
cuts it by about 2.5× on the suite's programs (a ResNet-18 step, a Stiefel MLP, a Muon
transformer):

- ``--xla_backend_optimization_level=0``: the LLVM backend's ``-O0``;
- ``--xla_cpu_use_fusion_emitters=false``: a fusion's loop is emitted by XLA's elemental
  IR emitter instead of the MLIR fusion emitters (whose lowering pipeline costs more than
  the small kernels gain);
- ``--xla_cpu_parallel_codegen_split_count=1``: one LLVM module per program instead of
  several compiled on threads, which two cores shared by two pytest workers cannot use.

XLA's HLO passes (fusion, layout, algebraic simplification) still run and fast-math stays
off, so a program's numbers agree with the default build's to the last bit or two (an
element-wise function's code may differ, e.g. in fused multiply-adds); a test that
compares bit for bit compares two programs compiled alike (jitted with jitted), not a
jitted program with eager operations. ``tests/conftest.py`` adds the flags to the pytest
processes' ``XLA_FLAGS``, :func:`xla_flags` to their subprocesses'. The benchmarks and the
experiments themselves run at XLA's defaults.

Many tests compile the same program: the same model and optimizer built in another test,
an experiment's smoke run and its rerun, a run killed and resumed, two entry points on
one workdir. ``tests/conftest.py`` makes one cache directory per session (shared by the
pytest-xdist workers), names it in :data:`VAR` and points the pytest processes' JAX at it
(every program cached, however quickly it compiled); :func:`env` does the same for a
subprocess. A test that must compile every program itself (e.g. to compare two
compilations) starts its subprocess without :func:`env`.
"""

from __future__ import annotations

import os

VAR = "ORTHOJAX_TEST_COMPILATION_CACHE"
FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                "--xla_cpu_parallel_codegen_split_count=1")


# For a subprocess whose steps, not its compiles, take the time (a ResNet's 11 M parameters
# for 16 steps): LLVM's -O1 vectorises the element-wise loops that -O0 leaves scalar. The
# E1 smoke run takes 33 s at -O1, 78 s at -O0 (its step 0.45 s against 2.8 s) and 36 s at
# XLA's defaults; the smaller experiments' smoke runs are faster at -O0.
RUN_BOUND = FAST_COMPILE.replace("optimization_level=0", "optimization_level=1")
# The same for one program in a pytest process: ``jax.jit(f, compiler_options=RUN_BOUND_JIT)``.
RUN_BOUND_JIT = {"xla_backend_optimization_level": 1}


def xla_flags(devices: int, run_bound: bool = False) -> str:
  """``XLA_FLAGS`` for a test's subprocess: ``devices`` simulated CPU devices, compiled
  as the pytest processes compile (:data:`FAST_COMPILE`), or with :data:`RUN_BOUND` for
  a program whose steps take longer than compiling it."""
  return f"--xla_force_host_platform_device_count={devices} " + (
      RUN_BOUND if run_bound else FAST_COMPILE)


def env(base: dict[str, str]) -> dict[str, str]:
  """``base`` with JAX's persistent compilation cache set to the session's directory
  (every program cached, however quickly it compiled); unchanged where the session has
  none or ``base`` names its own."""
  path = os.environ.get(VAR)
  if not path or "JAX_COMPILATION_CACHE_DIR" in base:
    return dict(base)
  return {**base, "JAX_COMPILATION_CACHE_DIR": path,
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
