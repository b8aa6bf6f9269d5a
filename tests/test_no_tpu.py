"""With the ``tpu`` extra installed on a machine without TPU chips, a program that imports
orthojax starts JAX without libtpu's error lines (``orthojax._no_tpu``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="the tpu extra")
def test_importing_orthojax_keeps_an_absent_tpu_quiet():
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  env["PYTHONPATH"] = REPO
  code = "import orthojax, jax, jax.numpy as jnp; print(jax.devices(), float(jnp.ones(3).sum()))"
  proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        timeout=300, check=True)
  assert proc.stdout.strip().endswith("3.0")
  if "TpuDevice" in proc.stdout:
    pytest.skip("this machine has TPU chips")
  assert "E0000" not in proc.stderr and "libtpu" not in proc.stderr, proc.stderr
  assert "TPU" not in proc.stderr, proc.stderr
