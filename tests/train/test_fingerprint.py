"""The record of a fit run's objects (:mod:`orthojax.train.fingerprint`): the same in every
process for the same code and values, and different where a value differs."""

from __future__ import annotations

import json
import subprocess
import sys

from flax import nnx
import jax
import numpy as np
import optax
import pytest

import orthojax as oj
from orthojax.train import fingerprint
from orthojax.train.resume import flatten

_BUILD = """
import json, optax, orthojax as oj
from orthojax.train import fingerprint
schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 10, 100)
tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-4),
                 oj.optim.radam(1e-3, oj.manifolds.Stiefel("cayley")))
print(json.dumps(fingerprint.describe_transform(tx), sort_keys=True))
"""


def _build():
  namespace = {}
  exec(_BUILD.replace("print(", "result = ("), namespace)   # pylint: disable=exec-used
  return json.loads(namespace["result"])


def test_the_same_code_gives_the_same_record_in_another_process():
  other = subprocess.run([sys.executable, "-c", _BUILD], capture_output=True, text=True,
                         check=True, env={"JAX_PLATFORMS": "cpu", "PATH": ""})
  assert json.loads(other.stdout) == _build()


@pytest.mark.parametrize("change, key", [
    ("1e-2, 10, 100", None),                                 # unchanged
    ("2e-2, 10, 100", "schedules.0.end_value"),              # the schedule's peak
    ("1e-2, 20, 100", "boundaries.0"),                       # its warmup ends later
])
def test_a_changed_value_is_the_leaf_that_differs(change, key):
  base = flatten(_build())
  namespace = {}
  exec(_BUILD.replace("1e-2, 10, 100", change).replace("print(", "result = ("), namespace)  # pylint: disable=exec-used
  changed = flatten(json.loads(namespace["result"]))
  differ = [k for k in sorted(set(base) | set(changed)) if base.get(k) != changed.get(k)]
  if key is None:
    assert not differ
  else:
    assert any(k.endswith(key) for k in differ), differ
    assert all(k.startswith("update.update_fns.1.") for k in differ), differ   # adamw only


def test_arrays_devices_and_meshes():
  small = np.arange(6, dtype=np.float32).reshape(2, 3)
  assert fingerprint._describe(small, 0, set()).startswith("float32[2, 3] sha256:")
  assert fingerprint._describe(small, 0, set()) != fingerprint._describe(small + 1, 0, set())
  assert fingerprint._describe(np.array([object()] * 2), 0, set()) == "object[2]"
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  assert fingerprint._describe(mesh, 0, set()) == "<jax._src.mesh.Mesh>"   # resumable


def test_a_model_is_recorded_by_its_variables():
  model = nnx.eval_shape(lambda: oj.nn.OrthogonalDense(4, 3, rngs=nnx.Rngs(0)))
  record = fingerprint.describe_model(model)
  assert record["name"] == "fit" and record["class"].endswith("OrthogonalDense")
  assert all(" float32[" in v for v in record["variables"].values()), record
