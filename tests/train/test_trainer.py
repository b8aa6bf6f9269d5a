"""End-to-end training: meshes agree, NaN guard, exact resume after SIGKILL, multi-process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import compile_cache
from tests.train.processes import run_together

from orthojax.train import data as data_lib
from orthojax.train import metrics as metrics_lib
from orthojax.train import trainer
from orthojax.train.config import Config

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_BASE = Config(model={"name": "MLP", "variant": "sp", "hidden": 32}, data={"name": "digits"},
               batch_size=32, num_steps=12, optimizer={"euclidean": {"name": "adam", "learning_rate": 3e-3}},
               log_every=4, seed=3)


def _losses(records):
  return [r["loss"] for r in records if r["split"] == "train"]


def _run(config, tmp_path, name, **kwargs):
  workdir = str(tmp_path / name)
  result = trainer.train(config.replace(workdir=workdir), print_fn=lambda line: None,
                         **kwargs)
  from orthojax.train.metrics import read_jsonl
  return result, read_jsonl(os.path.join(workdir, "metrics.jsonl"))


@pytest.mark.parametrize("variant", [
    dict(mesh={"data": -1}),                 # 8-way data parallel
    dict(mesh={"data": 2, "fsdp": 4}),       # params sharded over fsdp
])
def test_one_device_and_eight_devices_agree(tmp_path, variant):
  one, log1 = _run(_BASE.replace(mesh={"data": 1}), tmp_path, "one", devices=jax.devices()[:1])
  eight, log8 = _run(_BASE.replace(**variant), tmp_path, "eight")
  np.testing.assert_allclose(_losses(log8), _losses(log1), rtol=1e-5, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                                                       rtol=1e-5, atol=1e-6),
               eight.state.params, one.state.params)
  assert one.eval_metrics["examples"] == eight.eval_metrics["examples"] > 0


def test_training_learns_and_eval_counts_every_example(tmp_path):
  result, log = _run(_BASE.replace(num_steps=60, log_every=20), tmp_path, "learn")
  losses = _losses(log)
  assert losses[-1] < 0.5 * losses[0]
  info = data_lib.dataset_info("digits")
  assert result.eval_metrics["examples"] == info.num_eval
  assert result.eval_metrics["top1"] > 0.8


def test_grad_accumulation_matches_full_batch(tmp_path):
  full, _ = _run(_BASE.replace(num_steps=4), tmp_path, "full")
  accum, _ = _run(_BASE.replace(num_steps=4, grad_accum_steps=4), tmp_path, "accum")
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                                                       rtol=2e-5, atol=2e-6),
               accum.state.params, full.state.params)


def test_nan_stops_with_step_and_keeps_last_checkpoint(tmp_path, monkeypatch):
  real = data_lib.train_batches

  def poisoned(*args, **kwargs):
    for i, batch in enumerate(real(*args, **kwargs)):
      if i == 6:
        batch = dict(batch, x=np.full_like(batch["x"], np.nan))
      yield batch

  monkeypatch.setattr(data_lib, "train_batches", poisoned)
  config = _BASE.replace(checkpoint={"every_steps": 4}, log_every=1)
  with pytest.raises(trainer.NonFiniteLossError, match=r"at step 6\b.*step 4"):
    _run(config, tmp_path, "nan")
  from orthojax.train.checkpoint import Checkpointer
  ckpt = Checkpointer(str(tmp_path / "nan" / "checkpoints"), every_steps=4)
  assert ckpt.latest_step() == 4
  ckpt.close()
  # Skip policy: the bad update is dropped and training finishes.
  result, _ = _run(config.replace(nan_policy="skip"), tmp_path, "skip")
  assert int(result.state.skipped_steps) == 1 and result.final_step == config.num_steps


def test_skip_policy_stops_a_dead_run_and_logs_what_it_skipped(tmp_path, monkeypatch):
  """From batch 6 on every batch is NaN: a run that drops most of its updates stops
  at the first log step past step 20 instead of reporting success."""
  real = data_lib.train_batches

  def dead(*args, **kwargs):
    for i, batch in enumerate(real(*args, **kwargs)):
      yield dict(batch, x=np.full_like(batch["x"], np.nan)) if i >= 6 else batch

  monkeypatch.setattr(data_lib, "train_batches", dead)
  config = _BASE.replace(num_steps=40, log_every=2, nan_policy="skip",
                         checkpoint={"every_steps": 4})
  with pytest.raises(trainer.NonFiniteLossError,
                     match=r"14 of 20 updates were skipped.*config.max_skipped_fraction=0.5"):
    _run(config, tmp_path, "dead")
  from orthojax.train.metrics import read_jsonl
  logged = [r for r in read_jsonl(str(tmp_path / "dead" / "metrics.jsonl"))
            if r["split"] == "train"]
  assert [r["skipped_steps"] for r in logged[:4]] == [0, 0, 0, 2]
  # A threshold of 1 keeps going to the end, and says how many it dropped.
  printed = []
  result = trainer.train(config.replace(max_skipped_fraction=1.0, workdir=str(tmp_path / "on")),
                         print_fn=printed.append)
  assert int(result.state.skipped_steps) == 34 and result.final_step == 40
  assert any("34 non-finite updates skipped" in line for line in printed)


def _cli(workdir, *extra):
  return [sys.executable, "-m", "experiments.train", "--config=experiments/configs/train.py",
          "--config.model.hidden=32", "--config.batch_size=32", "--config.num_steps=40",
          "--config.optimizer.euclidean.learning_rate=3e-3", "--config.log_every=1",
          "--config.checkpoint.every_steps=3", "--config.seed=5", f"--workdir={workdir}", *extra]


def _env(devices=8):
  env = compile_cache.env(os.environ)
  env["XLA_FLAGS"] = compile_cache.xla_flags(devices)
  env["PYTHONPATH"] = _REPO + os.pathsep + env.get("PYTHONPATH", "")
  return env


# Two data-parallel devices: an all-reduce in every step, at a quarter of eight's cost
# (eight devices' kill and resume: tests/train/test_fit.py).
_KILL_DEVICES = 2


def _final_params(workdir):
  result = trainer.train(_BASE.replace(num_steps=40, seed=5, workdir=str(workdir),
                                       checkpoint={"every_steps": 3}),
                         devices=jax.devices()[:_KILL_DEVICES], print_fn=lambda line: None)
  assert result.final_step == 40
  return result.state.params


def test_sigkill_and_resume_matches_uninterrupted_run(tmp_path):
  # The uninterrupted run in this process (the CLI's config, compiled alike: the same
  # numbers); the interrupted one through the CLI, killed and resumed.
  straight = _final_params(tmp_path / "straight")
  killed = tmp_path / "killed"
  rng = np.random.default_rng()
  # Killed at two random steps (checkpoints every 3 steps are written asynchronously,
  # so a kill often lands during a save), resumed after each, then run to the end.
  for target in sorted(rng.choice(np.arange(5, 36), size=2, replace=False)):
    proc = subprocess.Popen(_cli(killed), env=_env(_KILL_DEVICES), cwd=_REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
      if line.startswith("[train] step ") and int(line.split()[2].split("/")[0]) >= target:
        time.sleep(rng.uniform(0.0, 0.05))   # anywhere in the step, or in its save
        break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  subprocess.run(_cli(killed), env=_env(_KILL_DEVICES), cwd=_REPO, check=True,
                 capture_output=True)

  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               _final_params(killed), straight)


def test_two_processes_match_one(tmp_path):
  port = 20000 + os.getpid() % 20000
  common = ["--config.mesh.data=-1", "--config.num_steps=6",
            "--config.checkpoint.every_steps=0"]
  run_together([_cli(tmp_path / "multi", *common, f"--coordinator_address=127.0.0.1:{port}",
                     "--num_processes=2", f"--process_id={i}") for i in range(2)],
               [_env(2)] * 2, _REPO, tmp_path, timeout=240)
  # One process of four devices: the CLI's config (_cli), trained here.
  _, single = _run(_BASE.replace(seed=5, num_steps=6, log_every=1, mesh={"data": -1},
                                 checkpoint={"every_steps": 0}),
                   tmp_path, "single", devices=jax.devices()[:4])
  from orthojax.train.metrics import read_jsonl
  multi = _losses(read_jsonl(str(tmp_path / "multi" / "metrics.jsonl")))
  single = _losses(single)
  assert len(multi) == 6
  np.testing.assert_allclose(multi, single, rtol=1e-5, atol=1e-6)


_LEVY = Config(model={"name": "MLP", "variant": "sp", "hidden": 16}, data={"name": "levy"},
               batch_size=100, num_steps=40, optimizer={"euclidean": {"name": "adam", "learning_rate": 3e-2}},
               loss="mse", log_every=10, eval_every=2, seed=1, restore_best=True,
               final_eval_splits=("test",), mesh={"data": 1})


def test_restore_best_evaluates_the_best_state_and_final_splits(tmp_path):
  result, log = _run(_LEVY, tmp_path, "best", devices=jax.devices()[:1])
  evals = [r for r in log if r["split"] == "eval"]
  during, final = evals[:-1], evals[-1]
  best = min(during, key=lambda r: r["loss"])
  assert best["step"] == result.best_eval["step"] < result.final_step or best["step"] == 40
  assert final["loss"] == pytest.approx(best["loss"], rel=1e-6)
  assert result.eval_metrics["loss"] == pytest.approx(best["loss"], rel=1e-6)
  # The returned best state is the one evaluated; the last state differs from it.
  assert int(result.best_state.step) == best["step"]
  test = result.split_metrics["test"]
  assert test["examples"] == 1000 and [r for r in log if r["split"] == "test"]
  # Without restore_best the final evaluation is of the last state.
  last, _ = _run(_LEVY.replace(restore_best=False), tmp_path, "last", devices=jax.devices()[:1])
  assert last.best_state is None
  if best["step"] != 40:
    assert last.eval_metrics["loss"] != pytest.approx(best["loss"], rel=1e-6)


def test_restore_best_survives_resume(tmp_path):
  one = jax.devices()[:1]
  every10 = _LEVY.replace(checkpoint={"every_steps": 10})
  straight, _ = _run(every10, tmp_path, "straight", devices=one)
  _run(every10.replace(num_steps=22), tmp_path, "resumed", devices=one)
  resumed, _ = _run(every10, tmp_path, "resumed", devices=one)
  assert resumed.best_eval["step"] == straight.best_eval["step"]
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               resumed.best_state.params, straight.best_state.params)
  assert resumed.split_metrics["test"] == pytest.approx(straight.split_metrics["test"])


@pytest.mark.parametrize("weights", ["stiefel", "oblique"])
def test_manifold_weights_train_on_the_manifold_through_the_partition(tmp_path, weights):
  """weights='stiefel'|'oblique': Riemannian Adam for the kernels, Adam for the rest, sharded
  over an fsdp mesh (optimizer state with MaskedNodes for the other partition)."""
  import orthojax as oj
  config = Config(model={"name": "DeepMLP", "depth": 3, "width": 16, "q_star": 0.5,
                         "init": "orthogonal", "weights": weights},
                  batch_size=64, num_steps=30,
                  optimizer={weights: {"name": "radam", "learning_rate": 1e-2},
                             "euclidean": {"name": "adam", "learning_rate": 1e-2}}, log_every=10,
                  mesh={"data": 2, "fsdp": 4}, seed=2)
  result, log = _run(config, tmp_path, weights)
  losses = _losses(log)
  assert losses[-1] < 0.7 * losses[0]
  manifold = oj.manifolds.Stiefel() if weights == "stiefel" else oj.manifolds.Oblique()
  params = result.state.params["model"]
  assert float(manifold.defect(params["in_kernel"])) < 1e-4
  assert float(jnp.max(manifold.defect(params["kernels"], view=oj.linalg.MatrixView.stacked()))
               ) < 1e-4


def _preempted_at(step, config, tmp_path, name):
  """Run ``config`` with a SIGTERM sent to this process at ``step`` (a spectrum hook;
  ``config.hooks.every_steps`` must be 1), restoring the signal handler afterwards."""
  def hook(at, model):
    if at == step:
      os.kill(os.getpid(), signal.SIGTERM)
    return {}

  previous = signal.getsignal(signal.SIGTERM)
  try:
    return _run(config, tmp_path, name, hooks=(hook,))[0]
  finally:
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_at_a_checkpoint_step_stops_cleanly_and_resumes(tmp_path):
  """Preemption noticed at a step the periodic save just wrote: one save, a clean stop."""
  config = _BASE.replace(checkpoint={"every_steps": 2}, hooks={"every_steps": 1}, num_steps=8)
  result = _preempted_at(4, config, tmp_path, "preempted")
  assert result.preempted and result.final_step == 4
  resumed, log = _run(config, tmp_path, "preempted")
  assert not resumed.preempted and resumed.final_step == 8
  assert [r["step"] for r in log if r["split"] == "train"] == [4, 8]   # log_every=4


def test_bfloat16_compute_trains_with_float32_params(tmp_path):
  f32, log32 = _run(_BASE.replace(num_steps=40, log_every=10), tmp_path, "f32")
  bf16, log16 = _run(_BASE.replace(num_steps=40, log_every=10, compute_dtype="bfloat16"),
                     tmp_path, "bf16")
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(bf16.state.params))
  l32, l16 = _losses(log32), _losses(log16)
  assert l16[-1] < 0.6 * l16[0]                                  # it learns
  np.testing.assert_allclose(l16, l32, rtol=0.05)                # like float32, to bf16 accuracy
  assert l16 != l32                                              # but it did compute in bf16


def test_logged_train_metrics_are_means_over_the_logging_interval(tmp_path):
  _, every = _run(_BASE.replace(log_every=1), tmp_path, "every")
  _, fourth = _run(_BASE.replace(log_every=4), tmp_path, "fourth")
  per_step = np.asarray(_losses(every))
  assert len(per_step) == 12 and len(_losses(fourth)) == 3
  np.testing.assert_allclose(_losses(fourth), per_step.reshape(3, 4).mean(axis=1), rtol=1e-6)


def test_interval_mean_skips_non_finite_steps_and_resets():
  from orthojax.train.metrics import IntervalMean
  mean = IntervalMean()
  for loss in (1.0, float("nan"), 3.0):
    mean.add({"loss": jnp.float32(loss), "grad_norm": jnp.float32(float("inf"))})
  result = mean.result()
  assert result["loss"] == 2.0 and np.isnan(result["grad_norm"])
  assert mean.result() == {}


def test_metrics_log_after_resume_reads_as_one_uninterrupted_run(tmp_path):
  """Preempted at step 6 (mid-interval, log_every=4), a row past the checkpoint
  planted as a crash would leave it, then resumed, then rerun once finished: the
  log has the uninterrupted run's rows — no duplicates, no stale rows, the
  interval mean at step 8 over steps 5–8 — and one final evaluation."""
  config = _BASE.replace(checkpoint={"every_steps": 3}, hooks={"every_steps": 1}, num_steps=12)
  _, straight = _run(config, tmp_path, "straight")
  result = _preempted_at(6, config, tmp_path, "resumed")
  assert result.preempted and result.final_step == 6
  with open(tmp_path / "resumed" / "metrics.jsonl", "a") as f:   # logged after the save
    f.write(json.dumps({"step": 7, "split": "train", "loss": 123.0}) + "\n")
  _run(config, tmp_path, "resumed")
  _, log = _run(config, tmp_path, "resumed")                       # finished: rerun
  keys = lambda records: [(r["step"], r["split"]) for r in records]
  assert keys(log) == keys(straight) == [(4, "train"), (8, "train"), (12, "train"),
                                         (12, "eval")]
  for a, b in zip(log, straight):
    for name in ("loss", "accuracy", "top1"):
      if name in b:
        assert a[name] == pytest.approx(b[name], rel=1e-6), (a, b)


def test_one_run_per_workdir(tmp_path):
  """A second run on a live run's workdir is refused in one line naming the holder;
  once the first is gone (even killed), the workdir is free again."""
  from orthojax.train.workdir_lock import WorkdirLock
  from orthojax.train.config import ConfigError
  workdir = str(tmp_path / "w")
  holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
      import sys, time
      from orthojax.train.workdir_lock import WorkdirLock
      with WorkdirLock({workdir!r}):
        print("locked", flush=True)
        time.sleep(60)
      """)], stdout=subprocess.PIPE, text=True, env=_env(1), cwd=_REPO)
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(ConfigError, match=rf"workdir .*in use by pid {holder.pid} on") as err:
      trainer.train(_BASE.replace(workdir=workdir), print_fn=lambda line: None)
    assert "\n" not in str(err.value)
  finally:
    holder.kill()   # SIGKILL: the kernel releases the lock
    holder.wait()
  with WorkdirLock(workdir):
    pass
  with pytest.raises(ConfigError, match="cannot write there"):
    with WorkdirLock(str(tmp_path / "w" / "run.lock" / "sub")):
      pass


def test_resume_refuses_a_changed_run_and_allows_the_rest(tmp_path):
  config = _BASE.replace(checkpoint={"every_steps": 4}, num_steps=8)
  _run(config.replace(num_steps=4), tmp_path, "run")
  saved = json.loads((tmp_path / "run" / "config.json").read_text())
  assert saved["optimizer"] == {"euclidean": {"name": "adam",
                                              "learning_rate": config.learning_rate}}
  from orthojax.train.config import ConfigError
  with pytest.raises(ConfigError, match=r"config.model.hidden=64 \(checkpoint: 32\), "
                                        r"config.optimizer.euclidean.learning_rate=0\.01 "
                                        r"\(checkpoint: 0\.003\)") as err:
    _run(config.replace(optimizer={"euclidean": {"learning_rate": 0.01}}, model={"hidden": 64}),
         tmp_path,
         "run")
  assert "\n" not in str(err.value)
  # Logging, evaluation, checkpoints, mesh and length (constant schedule) may change.
  result, _ = _run(config.replace(log_every=2, eval_every=2, checkpoint={"keep": 5},
                                  mesh={"data": 2, "fsdp": 4}), tmp_path, "run")
  assert result.final_step == 8
  with pytest.raises(ConfigError, match="num_steps"):
    _run(config.replace(num_steps=12, schedule="cosine"), tmp_path, "run")


def test_a_checkpoint_of_an_earlier_layout_is_refused_in_one_line(tmp_path, monkeypatch):
  """A checkpoint whose recorded config is not in today's layout (here a flat one) is
  not translated: the run stops with one line that says so and names the way out."""
  config = _BASE.replace(checkpoint={"every_steps": 4}, num_steps=4)
  _run(config, tmp_path, "run")
  from orthojax.train import checkpoint as ckpt_lib
  from orthojax.train.config import ConfigError
  flat = {"model": "mlp", "lr": 0.003, "num_steps": 4}
  meta = ckpt_lib.Checkpointer.meta
  monkeypatch.setattr(ckpt_lib.Checkpointer, "meta",
                      lambda self, step: {**meta(self, step), "config": flat})
  with pytest.raises(ConfigError) as err:
    _run(config.replace(num_steps=8), tmp_path, "run")
  assert str(err.value) == (
      f"config.workdir={str(tmp_path / 'run')!r}: its checkpoint (step 4) was written by an "
      "earlier orthojax layout (config.lr is not a key) and cannot be resumed; start a new "
      "workdir")

def _flip_one_bit(path):
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0x01
  path.write_bytes(bytes(data))


_DAMAGED = _BASE.replace(num_steps=12, checkpoint={"every_steps": 4})


@pytest.fixture(scope="module")
def checkpointed_twice(tmp_path_factory):
  """The uninterrupted run of :data:`_DAMAGED` (its final state) and a workdir of the same
  run stopped after step 8 (steps 4 and 8 saved), which each test copies and damages."""
  tmp = tmp_path_factory.mktemp("damaged")
  straight, _ = _run(_DAMAGED, tmp, "straight")
  _run(_DAMAGED.replace(num_steps=8), tmp, "run")
  return straight.state, tmp / "run"


@pytest.mark.xdist_group("trainer_damaged_checkpoint")   # one worker: one shared fixture
@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "unverified"])
def test_damaged_newest_checkpoint_falls_back_to_the_intact_one(tmp_path, damage,
                                                               checkpointed_twice):
  """A bit flipped in a data file, a truncated or deleted file, or a save that never
  got its checksums: the newest step is reported, set aside, and the run resumes
  from the newest intact one — ending exactly as the uninterrupted run."""
  config = _DAMAGED
  straight, template = checkpointed_twice
  shutil.copytree(template, tmp_path / "run")                 # steps 4 and 8 saved
  step_dir = tmp_path / "run" / "checkpoints" / "8"
  data = max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  if damage == "flip":
    _flip_one_bit(data)
  elif damage == "truncate":
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
  elif damage == "delete":
    (step_dir / "state" / "_METADATA").unlink()
  else:
    (tmp_path / "run" / "checkpoint_checksums" / "8.json").unlink()
  printed = []
  result = trainer.train(config.replace(workdir=str(tmp_path / "run")),
                         print_fn=printed.append)
  assert any("step 8" in line and "not usable" in line for line in printed), printed
  assert any("Resumed from" in line and "at step 4" in line for line in printed), printed
  assert (tmp_path / "run" / "checkpoints_unusable" / "8").exists()
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               result.state.params, straight.params)


def test_no_intact_checkpoint_is_one_line_and_moves_nothing(tmp_path):
  config = _BASE.replace(num_steps=4, checkpoint={"every_steps": 4})
  _run(config, tmp_path, "run")
  _flip_one_bit(max((p for p in (tmp_path / "run" / "checkpoints" / "4").rglob("*")
                     if p.is_file()), key=lambda p: p.stat().st_size))
  from orthojax.train.config import ConfigError
  with pytest.raises(ConfigError, match="no checkpoint in .* is intact") as err:
    _run(config.replace(num_steps=8), tmp_path, "run")
  assert "\n" not in str(err.value)
  assert (tmp_path / "run" / "checkpoints" / "4").exists()


def test_steps_per_sec_counts_training_not_the_compile_or_writing_a_line():
  """No rate (nor ETA) before the second line, so the compile is in none. The first
  TensorBoard write imports TensorFlow (seconds): the interval after it must not pay
  for it. Here the console itself takes 0.3 s a line."""
  slow = lambda line: time.sleep(0.3)
  writer = metrics_lib.MetricsWriter(None, total_steps=100, print_fn=slow, is_writer=True)
  time.sleep(0.3)   # the compile, before the first step: the first line gives no rate
  assert "steps_per_sec" not in writer.write(10, {"loss": 1.0})
  values = writer.write(20, {"loss": 0.5})
  assert values["steps_per_sec"] > 100, values   # 10 steps in ~0 s, not in 0.3 s


def _loop(config, print_fn=None):
  """A Loop over ``config`` on one device, built as :func:`trainer.train` builds it."""
  from orthojax.train import inputs
  from orthojax.train import program as program_lib
  program = program_lib.build_program(config, program_lib.dataset_info(config),
                                      devices=jax.devices()[:1], num_processes=1)
  source = inputs.RegisteredInput(config.data["name"], config.options, config.data_dir)
  return trainer.Loop(program, source, print_fn=print_fn)


def test_a_loop_is_built_without_touching_its_workdir_then_run(tmp_path):
  """Building a Loop reads and writes nothing; run() takes the workdir, writes
  config.json and the checkpoints, and a second Loop over it resumes."""
  workdir = tmp_path / "w"
  config = _BASE.replace(mesh={"data": 1}, num_steps=4, checkpoint={"every_steps": 2},
                         workdir=str(workdir))
  printed = []
  loop = _loop(config, printed.append)
  assert not workdir.exists() and not list(tmp_path.iterdir())
  result = loop.run()
  assert result.final_step == 4
  assert json.loads((workdir / "config.json").read_text()) == config.to_dict()
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2", "4"]
  assert any(line.startswith("[train] step 4/4") for line in printed), printed
  with pytest.raises(RuntimeError, match="runs once"):
    loop.run()
  again = _loop(config.replace(num_steps=6), printed.append)
  assert again.run().final_step == 6
  assert any(line.startswith(f"Resumed from {workdir / 'checkpoints'} at step 4")
             for line in printed), printed


def test_console_lines_go_to_logging_unless_print_fn_is_given(tmp_path, caplog):
  config = _BASE.replace(mesh={"data": 1}, num_steps=4, workdir=str(tmp_path / "w"))
  with caplog.at_level("INFO", logger="orthojax"):
    trainer.train(config, devices=jax.devices()[:1])
  lines = [r.getMessage() for r in caplog.records if r.name == "orthojax.train.trainer"]
  assert any(line.startswith("[train] step 4/4") for line in lines), lines
  assert any(line.startswith("Done: 4 steps") for line in lines), lines
  caplog.clear()
  printed = []
  with caplog.at_level("INFO", logger="orthojax"):
    trainer.train(config.replace(workdir=str(tmp_path / "v")), devices=jax.devices()[:1],
                  print_fn=printed.append)
  assert not [r for r in caplog.records if r.name.startswith("orthojax")]
  assert any(line.startswith("[train] step 4/4") for line in printed), printed
