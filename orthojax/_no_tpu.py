"""On a machine without TPU chips, keep JAX from starting the TPU runtime.

With ``libtpu`` installed (the ``tpu`` extra, for the pod compile check), JAX registers a
TPU backend and, on the first use of any device, loads ``libtpu.so`` to try it. Without
TPU chips that attempt fails — quietly as far as JAX is concerned, but libtpu prints
five lines of errors first (``E0000 … unexpected worker hostname``). When no TPU chip is
present (JAX's own PCI check), the platforms are not pinned (``JAX_PLATFORMS``), and
the backends have not started yet, importing orthojax replaces that backend's factory by
one that reports it absent at once, so nothing is loaded. The pod compile check is unaffected: it loads libtpu for abstract
devices through ``jax.experimental.topologies``, not through the backend.

This touches JAX internals (``jax._src.xla_bridge._backend_factories``), guarded: with
another JAX layout it does nothing and the lines come back.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os


def _absent() -> None:
  return None   # JAX reads None as "this backend is not available" (fail_quietly)


def drop_absent_tpu_backend() -> bool:
  """Replace JAX's TPU backend factory when it can only fail; True when it was replaced."""
  if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
    return False
  try:
    from jax._src import hardware_utils  # pylint: disable=g-import-not-at-top
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    if hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0:
      return False
    with xla_bridge._backend_lock:   # pylint: disable=protected-access
      if xla_bridge._backends:   # pylint: disable=protected-access  (already started)
        return False
      factories = xla_bridge._backend_factories   # pylint: disable=protected-access
      if "tpu" not in factories or not factories["tpu"].fail_quietly:
        return False
      factories["tpu"] = dataclasses.replace(factories["tpu"], factory=_absent)
      return True
  except (ImportError, AttributeError, TypeError):
    return False
