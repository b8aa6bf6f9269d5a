"""Shared test settings.

Eight simulated CPU devices so sharding tests can build real meshes; the flag
must be set before jax is first imported. Hypothesis runs without deadlines
(jit compilation makes the first example slow) and with few examples in CI. XLA:CPU
compiles at LLVM -O0 (tests/compile_cache.py).
The programs tests run as subprocesses share one XLA compilation cache per session
(tests/compile_cache.py).
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# LLVM -O0 for the suite's small programs: half the compile time, the same numbers
# (tests/compile_cache.py says why).
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # tests never need a GPU
# libtpu is installed for the pod compile check; tests run on the CPU backend and
# reach TPUs only as abstract compile targets.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# jaxlib's CPU SVD/QR call OpenBLAS, whose threads fight XLA's on 2 cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import shutil  # noqa: E402
import tempfile  # noqa: E402

from hypothesis import HealthCheck, settings  # noqa: E402
import pytest  # noqa: E402

from tests import compile_cache  # noqa: E402

settings.register_profile(
    "ci", max_examples=8, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "dev", max_examples=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

_OWN_CACHE = pytest.StashKey[str]()


def pytest_configure(config):
  """One compilation cache directory for the session's subprocesses (tests/compile_cache.py),
  made by the first pytest process (the xdist controller) and inherited by its workers."""
  if not os.environ.get(compile_cache.VAR):
    path = tempfile.mkdtemp(prefix="orthojax-test-xla-cache-")
    os.environ[compile_cache.VAR] = path
    config.stash[_OWN_CACHE] = path


def pytest_unconfigure(config):
  path = config.stash.get(_OWN_CACHE, None)
  if path:
    shutil.rmtree(path, ignore_errors=True)
    os.environ.pop(compile_cache.VAR, None)
