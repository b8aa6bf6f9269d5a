"""E1: flagfiles, the smoke run (checkpoint, SIGTERM, resume, eval, report), missing ImageNet."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

from absl import flags
from ml_collections import config_flags
import pytest

from experiments import resnet50
from orthojax.train.config import Config
from tests import compile_cache
from tests.experiments import _cli

SMOKE = "--flagfile=experiments/flags/resnet50_smoke.flags"
PNG = b"\x89PNG\r\n\x1a\n"


def _config(flagfile: str):
  """The Config a flagfile gives with the training flags only (as experiments.train reads it:
  its --config line and overrides)."""
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "the config", flag_values=fv)
  cwd = os.getcwd()
  os.chdir(_cli.REPO)    # config file paths are relative to the repository root
  try:
    fv(["prog", f"--flagfile={flagfile}"])
    tree = fv.config.to_dict()
  finally:
    os.chdir(cwd)
  return Config.from_dict({**tree, "workdir": "/tmp/unused"}).validate(num_devices=1)


@pytest.mark.parametrize("variant", ["bn", "wn_mbn", "gmp_imn"])
def test_e1_flagfiles_are_the_papers_recipe(variant):
  config = _config(f"experiments/flags/e1_resnet50_{variant}.flags")
  assert (config.model["name"], config.model["depth"], config.model["norm"],
          config.data["name"]) == ("ResNet", 50, variant, "imagenet2012")
  sgd = config.optimizer["euclidean"]
  assert (sgd["name"], sgd["momentum"], sgd["nesterov"],
          config.learning_rate, config.batch_size) == ("sgd", 0.9, False, 0.1, 256)
  assert config.weight_decay == 1e-4 and set(config.optimizer) == {"euclidean"}
  assert (config.schedule, config.plateau_patience, config.plateau_factor) == ("plateau", 5, 0.1)
  assert config.early_stopping_patience == 10 and config.num_epochs == 90
  assert config.restore_best and config.loss == "cross_entropy"
  assert config.eval_every == config.checkpoint.every_steps == resnet50.IMAGENET_TRAIN // 256
  assert config.checkpoint.keep == 3
  assert variant in resnet50.PAPER


def test_smoke_plots_say_they_ran_on_fake_data():
  from experiments import _harness
  import matplotlib.pyplot as plt
  dataset = _config("experiments/flags/resnet50_smoke.flags").data["name"]
  titles = resnet50.plot_titles("resnet18", "bn", dataset)
  for title in titles:
    assert "on FAKE data (random images: a smoke test, the numbers mean nothing)" in title
  fig = _harness.bar_figure([_harness.Row({"model": "resnet18", "variant": "bn"}, "top-1 (%)",
                                          [10.0], 73.63)], group="model", series="variant",
                            title=titles[0])
  suptitle = fig.get_suptitle()   # wrapped to the figure's width, whole words kept
  assert " ".join(suptitle.split()) == titles[0]
  assert all(len(line) <= fig.get_figwidth() * 14 for line in suptitle.splitlines())
  plt.close(fig)
  for title in resnet50.plot_titles("resnet50", "bn", "imagenet2012"):
    assert "on imagenet2012" in title and "FAKE" not in title


def test_smoke_flagfile_is_the_recipe_scaled_down():
  config = _config("experiments/flags/resnet50_smoke.flags")
  assert (config.model["name"], config.model["depth"], config.model["norm"]) == (
      "ResNet", 18, "bn")
  assert config.data["name"] == "fake" and config.batch_size == 8
  assert [config.options[k] for k in ("height", "width", "num_train", "num_eval")] == [
      32, 32, 32, 16]
  assert config.learning_rate == 0.003125 and config.optimizer["euclidean"]["momentum"] == 0.9
  assert (config.num_steps, config.num_epochs, config.eval_every,
          config.checkpoint.every_steps, config.log_every) == (16, 0, 4, 2, 1)
  assert config.schedule == "plateau" and config.restore_best


def _popen(*args: str) -> subprocess.Popen:
  env = compile_cache.env(os.environ)
  env["XLA_FLAGS"] = compile_cache.xla_flags(1, run_bound=True)
  env["PYTHONPATH"] = _cli.REPO + os.pathsep + env.get("PYTHONPATH", "")
  return subprocess.Popen([sys.executable, "-m", "experiments.resnet50", *args], env=env,
                          cwd=_cli.REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def _train_steps(path) -> list[int]:
  if not os.path.exists(path):
    return []
  steps = []
  with open(path) as f:
    for line in f:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        continue
      if record.get("split") == "train":
        steps.append(record["step"])
  return steps


def _checkpoints(run_dir) -> list[int]:
  path = run_dir / "checkpoints"
  return sorted(int(p) for p in os.listdir(path) if p.isdigit()) if path.exists() else []


def test_smoke_run_across_entry_points_is_preempted_resumes_and_reports(tmp_path):
  """One smoke run, started by ``experiments.train`` and finished by
  ``experiments.resnet50`` on the same workdir (the same flagfile trains in the same
  place under either entry point), with a preemption in between:

  1. ``experiments.train`` trains it to step 8: checkpoints and ``config.json`` in the
     workdir itself (E1 is a single run).
  2. ``experiments.resnet50`` resumes it and is sent SIGTERM, as a preemption would,
     once a checkpoint (every 2 steps) and a few more steps are past step 8: it saves a
     checkpoint and exits 75.
  3. The same command resumes from that checkpoint, finishes at step 16 with an
     evaluation every epoch, and writes the report beside the run.
  """
  workdir = tmp_path / "e1"
  run_dir = workdir   # E1 is a single run: it trains in the workdir itself
  half = _cli.run("train", SMOKE, f"--workdir={workdir}", "--config.num_steps=8",
                  timeout=300, run_bound=True)
  assert "final step 8" in half.stdout
  assert _checkpoints(run_dir)[-1] == 8 and (workdir / "config.json").exists()

  proc = _popen(SMOKE, f"--workdir={workdir}")
  deadline = time.monotonic() + 240
  try:
    while True:
      if proc.poll() is not None:
        out, err = proc.communicate()
        pytest.fail(f"run ended before it could be preempted:\n{out[-2000:]}\n{err[-2000:]}")
      if time.monotonic() > deadline:
        pytest.fail("no checkpoint past step 8 after 240 s")
      if _checkpoints(run_dir)[-1] > 8 and max(_train_steps(run_dir / "metrics.jsonl")) >= 10:
        break
      time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert f"Resumed from {run_dir / 'checkpoints'} at step 8" in out
  assert proc.returncode == 75   # EX_TEMPFAIL: preempted, checkpoint saved (requeue me)
  saved = int(re.search(r"Preempted: saved step (\d+)", out).group(1))
  assert 10 <= saved < 16
  assert "rerun the same command to resume" in err
  assert saved in _checkpoints(run_dir)
  assert not (run_dir / "result.json").exists()

  again = _cli.run("resnet50", SMOKE, f"--workdir={workdir}", timeout=300, run_bound=True)
  assert f"Resumed from {run_dir / 'checkpoints'} at step {saved}" in again.stdout
  record = json.loads((run_dir / "result.json").read_text())
  assert record["final_step"] == 16
  assert record["eval"]["examples"] == 16
  for key in ("top1", "top5", "loss"):
    assert math.isfinite(record["eval"][key]), key
  assert 0 <= record["eval"]["top1"] <= record["eval"]["top5"] <= 1
  assert record["throughput"]["images_per_sec"] > 0
  assert _checkpoints(run_dir)[-1] == 16 and len(_checkpoints(run_dir)) <= 3   # keep 3
  logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
  evals = sorted({r["step"] for r in logged if r["split"] == "eval"})
  assert evals == [4, 8, 12, 16]       # every epoch (4 steps), the last one final
  train_steps = sorted({r["step"] for r in logged if r["split"] == "train"})
  assert train_steps == list(range(1, 17))   # nothing lost across the two resumes

  # The report: Table 1's numbers in the paper column, flagged as not comparable.
  assert not (workdir / "runs").exists()
  results = json.loads((workdir / "results.json").read_text())
  rows = {r["metric"]: r for r in results["rows"]}
  assert rows["top-1 (%)"]["paper"] == resnet50.PAPER["bn"][0] == 73.63
  assert rows["top-5 (%)"]["paper"] == resnet50.PAPER["bn"][1] == 91.11
  assert rows["top-1 (%)"]["ours"] == [pytest.approx(100 * record["eval"]["top1"])]
  assert "not comparable" in rows["top-1 (%)"]["note"]
  assert rows["throughput (images/s)"]["paper"] is None
  assert rows["throughput (images/s)"]["ours"][0] == pytest.approx(
      record["throughput"]["images_per_sec"])
  assert all(r["setting"] == {"model": "resnet18", "variant": "bn", "batch": 8}
             for r in results["rows"])
  assert "| resnet18 | bn | 8 | top-1 (%) | 73.63 |" in (workdir / "report.md").read_text()
  for name in ("e1_accuracy.png", "e1_curves.png"):
    assert (workdir / name).read_bytes()[:8] == PNG and (workdir / name).stat().st_size > 5000
    assert f"Plot: {workdir / name}" in again.stdout
    assert f"![{name}]({name})" in (workdir / "report.md").read_text()
  # The wall time counts E1's two sittings, the preempted one and the resumed one.
  sittings = json.loads((workdir / "wall_time.json").read_text())
  assert len(sittings) == 2 and all(s > 0 for s in sittings.values())
  assert results["seconds"] == pytest.approx(sum(sittings.values()))


def test_missing_imagenet_stops_with_the_manual_download_steps(tmp_path):
  empty = tmp_path / "tensorflow_datasets"
  empty.mkdir()
  proc = _cli.run("resnet50", "--flagfile=experiments/flags/e1_resnet50_bn.flags",
                  f"--workdir={tmp_path / 'e1'}", f"--config.data.data_dir={empty}",
                  check=False, timeout=180)
  assert proc.returncode == 2, proc.stderr[-2000:]
  err = proc.stderr
  assert f"error: imagenet2012 is not prepared in {empty}" in err
  assert "manual" in err and f"{empty}/downloads/manual" in err
  assert "ILSVRC2012_img_train.tar" in err and f"tfds build imagenet2012 --data_dir={empty}" in err
  assert not (tmp_path / "e1").exists() or not any((tmp_path / "e1").iterdir())


@pytest.mark.parametrize("flag, message", [
    ("--config.model.norm=gmp", "config.model.norm='gmp': "),   # ResNet's own message
    ("--config=experiments/configs/e2_vgg6.py:smoke", "config.model.name='VGG6': E1 needs "
                                                      "'ResNet'"),
])
def test_bad_flags_fail_fast_with_one_line(tmp_path, flag, message):
  proc = _cli.forked("resnet50", SMOKE, f"--workdir={tmp_path}", flag)
  assert proc.returncode == 2, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: {message}"), last
  assert not [p.name for p in tmp_path.iterdir()]   # nothing written
