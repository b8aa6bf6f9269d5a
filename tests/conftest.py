"""Shared test settings.

Eight simulated CPU devices so sharding tests can build real meshes; the flag
must be set before jax is first imported. Hypothesis runs without deadlines
(jit compilation makes the first example slow) and with few examples in CI.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # tests never need a GPU
# libtpu is installed for the pod compile check; tests run on the CPU backend and
# reach TPUs only as abstract compile targets.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# jaxlib's CPU SVD/QR call OpenBLAS, whose threads fight XLA's on 2 cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=8, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "dev", max_examples=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
