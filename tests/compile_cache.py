"""One persistent XLA compilation cache for the programs a test session runs as subprocesses.

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


def env(base: dict[str, str]) -> dict[str, str]:
  """``base`` with JAX's persistent compilation cache set to the session's directory
  (every program cached, however quickly it compiled); unchanged where the session has
  none or ``base`` names its own."""
  path = os.environ.get(VAR)
  if not path or "JAX_COMPILATION_CACHE_DIR" in base:
    return dict(base)
  return {**base, "JAX_COMPILATION_CACHE_DIR": path,
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
