"""config.mesh.shard_update in the trainer: same training, resumable either way, multi-process.

A Stiefel DeepMLP (a scanned stack of 5 hidden kernels on 8 devices: fewer layers than
owners) trained with Riemannian Adam, the rest with Adam.
"""

from __future__ import annotations

import os
import sys
import textwrap

import jax
import numpy as np
import pytest

import orthojax as oj
from tests import compile_cache
from tests.train.processes import run_together
from orthojax.train import trainer
from orthojax.train.config import Config

# The tests compare with one reference run (the module's fixture): on one xdist worker.
pytestmark = pytest.mark.xdist_group("shard_update_training")

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_STIEFEL_FIELDS = dict(model={"name": "DeepMLP", "depth": 5, "width": 16, "q_star": 0.5,
                              "init": "orthogonal", "weights": "stiefel"},
                       batch_size=64, num_steps=8, schedule="constant",
                       optimizer={"stiefel": {"name": "radam", "learning_rate": 1e-2},
                                  "euclidean": {"name": "adam", "learning_rate": 1e-2}},
                       log_every=4,
                       seed=2)
_STIEFEL = Config(**_STIEFEL_FIELDS)


def _train(config, workdir, devices=None):
  return trainer.train(config.replace(workdir=str(workdir)), devices=devices,
                       print_fn=lambda line: None)


def _sharded_nodes(state):
  is_sharded = lambda x: isinstance(x, oj.optim.ShardedUpdateState)
  return [x for x in jax.tree.leaves(state, is_leaf=is_sharded) if is_sharded(x)]


def _close(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y),
                                                       rtol=2e-5, atol=2e-6), a, b)


# Session-scoped fixtures: each is built once, on the xdist worker that runs its group.
# A module-scoped fixture is torn down and rebuilt whenever that worker's queue puts
# another module's test between the group's tests.
@pytest.fixture(scope="session")
def replicated(tmp_path_factory):
  """The reference: 8 steps on this process's 8 devices with the replicated update."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 (simulated) devices")
  return _train(_STIEFEL.replace(mesh={"shard_update": False}),
                tmp_path_factory.mktemp("replicated"))


def test_sharded_and_replicated_updates_train_the_same(tmp_path, replicated):
  on = _train(_STIEFEL, tmp_path / "on")
  off = replicated
  (node,) = _sharded_nodes(on.state.opt_state)
  assert node.layout.num_owners == 8 and not _sharded_nodes(off.state.opt_state)
  for rows in node.owned.values():   # each device holds its own owner's row only
    assert {s.data.shape[0] for s in rows.addressable_shards} == {1}
  _close(on.state.params, off.state.params)
  _close(oj.optim.replicated_state(on.state.opt_state), off.state.opt_state)


def test_split_matrices_train_the_same(tmp_path, replicated):
  """mesh.split_above: the input kernel, above the mean owner load, is updated by all
  eight devices (its long side split over them); the stack by its owners."""
  on = _train(_STIEFEL.replace(mesh={"split_above": 0.5}), tmp_path / "split")
  (node,) = _sharded_nodes(on.state.opt_state)
  assert len(node.layout.split) == 1
  _close(on.state.params, replicated.state.params)
  _close(oj.optim.replicated_state(on.state.opt_state), replicated.state.opt_state)


def test_resume_switches_setting_and_device_count(tmp_path, replicated):
  """4 steps sharded on 8 devices, 2 replicated on 4, 2 sharded on 2 = the 8 steps of the
  uninterrupted run (replicated on 8, which the sharded update matches: the tests above)."""
  config = _STIEFEL.replace(checkpoint={"every_steps": 2})
  workdir = tmp_path / "switched"
  _train(config.replace(num_steps=4), workdir)
  _train(config.replace(num_steps=6, mesh={"shard_update": False}), workdir,
         devices=jax.devices()[:4])
  resumed = _train(config, workdir, devices=jax.devices()[:2])
  assert resumed.final_step == 8 == replicated.final_step
  assert _sharded_nodes(resumed.state.opt_state)[0].layout.num_owners == 2
  _close(resumed.state.params, replicated.state.params)


_DRIVER = textwrap.dedent("""
    import sys
    from orthojax.train import distributed
    port, pid, out, fields = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    distributed.initialize(enabled=True, coordinator_address=f"127.0.0.1:{port}",
                           num_processes=2, process_id=pid)
    import ast, jax, numpy as np
    from orthojax.train import trainer
    from orthojax.train.config import Config
    config = Config(**ast.literal_eval(fields), workdir=out)
    result = trainer.train(config, print_fn=lambda line: None)
    kernels = jax.experimental.multihost_utils.process_allgather(
        result.state.params["model"]["kernels"], tiled=True)
    if pid == 0:
      np.save(out + "/kernels.npy", np.asarray(kernels))
""")


def test_two_processes_of_four_devices_match_one_process_of_eight(tmp_path, replicated):
  driver = tmp_path / "driver.py"
  driver.write_text("import jax.experimental.multihost_utils\n" + _DRIVER)
  env = dict(os.environ, PYTHONPATH=_REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  port = str(21000 + os.getpid() % 20000)
  run_together([[sys.executable, str(driver), port, str(i), str(tmp_path / "multi"),
                 repr(_STIEFEL_FIELDS)] for i in range(2)],
               [{**env, "XLA_FLAGS": compile_cache.xla_flags(4)}] * 2,
               _REPO, tmp_path)
  np.testing.assert_allclose(np.load(tmp_path / "multi" / "kernels.npy"),
                             np.asarray(replicated.state.params["model"]["kernels"]),
                             rtol=2e-5, atol=2e-6)
