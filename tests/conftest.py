"""Shared test settings.

Eight simulated CPU devices so sharding tests can build real meshes; the flag
must be set before jax is first imported. Hypothesis runs without deadlines
(jit compilation makes the first example slow) and with few examples in CI. XLA:CPU
compiles with its quickest settings (tests/compile_cache.py).
The pytest processes and the programs tests run as subprocesses share one persistent XLA
compilation cache per session (tests/compile_cache.py).
"""

import os

from tests import compile_cache

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# XLA:CPU's quickest compiler settings for the suite's small programs: 2.5x less compile
# time, the same numbers (tests/compile_cache.py says why).
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " " + compile_cache.FAST_COMPILE
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

settings.register_profile(
    "ci", max_examples=8, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "dev", max_examples=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

_OWN_CACHE = pytest.StashKey[str]()
_OWN_TMPDIR = pytest.StashKey[tuple]()


def _session_tmpdir(config) -> None:
  """The session's scratch files in one directory, removed at its end: ``TMPDIR`` for the
  workers and subprocesses, ``tempfile.tempdir`` here. tfds leaves an empty ``tmp…tfds``
  directory behind each time it builds a builder whose data is not prepared
  (``DatasetInfo.initialize_from_bucket``), some 180 a run. pytest's own ``tmp_path``
  base is fixed first, so it stays where pytest keeps it between runs."""
  if os.environ.get("ORTHOJAX_TEST_TMPDIR"):   # a worker: the controller made it
    return
  factory = getattr(config, "_tmp_path_factory", None)
  if factory is not None:
    factory.getbasetemp()
  path = tempfile.mkdtemp(prefix="orthojax-test-tmp-")
  config.stash[_OWN_TMPDIR] = (path, os.environ.get("TMPDIR"), tempfile.tempdir)
  os.environ["ORTHOJAX_TEST_TMPDIR"] = os.environ["TMPDIR"] = tempfile.tempdir = path


@pytest.hookimpl(trylast=True)   # after pytest's tmp_path plugin has configured
def pytest_configure(config):
  """One compilation cache directory for the session (tests/compile_cache.py), made by the
  first pytest process (the xdist controller) and inherited by its workers and their
  subprocesses; likewise one scratch directory (``_session_tmpdir``)."""
  _session_tmpdir(config)
  if not os.environ.get(compile_cache.VAR):
    path = tempfile.mkdtemp(prefix="orthojax-test-xla-cache-")
    os.environ[compile_cache.VAR] = path
    config.stash[_OWN_CACHE] = path
  import jax
  jax.config.update("jax_compilation_cache_dir", os.environ[compile_cache.VAR])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
  path = config.stash.get(_OWN_CACHE, None)
  if path:
    shutil.rmtree(path, ignore_errors=True)
    os.environ.pop(compile_cache.VAR, None)
  own = config.stash.get(_OWN_TMPDIR, None)
  if own:
    path, tmpdir, tempfile.tempdir = own
    shutil.rmtree(path, ignore_errors=True)
    os.environ.pop("ORTHOJAX_TEST_TMPDIR")
    if tmpdir is None:
      os.environ.pop("TMPDIR")
    else:
      os.environ["TMPDIR"] = tmpdir


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
  """``--dist loadgroup`` under pytest >= 9.2: pytest-xdist (3.8) marks a test's group by
  assigning ``item._nodeid`` (``…@group``), but pytest now reads a node's id from
  ``item._id``, so the mark was lost and every group split over the workers. Carry
  xdist's id over (a worker's hook; the controller schedules by the ids it reports)."""
  if not getattr(config.option, "loadgroup", False):   # set in xdist's workers only
    return
  from _pytest.nodeid import NodeId  # pylint: disable=import-outside-toplevel
  for item in items:
    marked = item.__dict__.get("_nodeid")
    if marked and "@" in marked and str(item.nodeid) != marked:
      item._id = NodeId.parse(marked)  # pylint: disable=protected-access
