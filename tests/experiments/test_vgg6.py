"""E2: run plan and Table 2 mapping, the smoke flagfile, missing data, bad flags.

The smoke run uses the ``fake`` dataset at 32×32: the ImageNet32 tfds pipeline itself is
trained end to end on ``tfds.testing.mock_data`` in ``tests/train/test_trainer_tfds.py``;
an experiment run cannot be, because every run writes Orbax checkpoints and tfds' mock
patches the file-system calls Orbax uses (its saves fail under the mock).
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import pytest

from experiments import vgg6_imagenet32 as e2
from experiments.configs import e2_vgg6 as e2_config
from orthojax.train.config import Config
from tests.experiments import _cli

SMOKE = "--flagfile=experiments/flags/vgg6_smoke.flags"
PNG = b"\x89PNG\r\n\x1a\n"


def test_plan_sets_lr_per_variant_and_one_epoch_per_batch():
  base = Config(model={"name": "VGG6", "variant": "sp"},
                optimizer={"euclidean": {"name": "sgd", "learning_rate": 0.01, "momentum": 0.9}},
                batch_size=256, num_epochs=90, eval_every=1, checkpoint={"every_steps": 1},
                schedule="plateau")
  plan = e2.plan_runs(base, ["bn", "gmp_imn"], [256, 1024], 0.1, num_train=1_281_167)
  got = {(r.tags, r.config.model["variant"], r.config.learning_rate, r.config.batch_size,
          r.config.eval_every, r.config.checkpoint.every_steps) for r in plan}
  assert got == {
      ((("variant", "bn"), ("batch", 256)), "bn", 0.01, 256, 5004, 5004),
      ((("variant", "gmp_imn"), ("batch", 256)), "gmp_imn", 0.1, 256, 5004, 5004),
      ((("variant", "bn"), ("batch", 1024)), "bn", 0.01, 1024, 1251, 1251),
      ((("variant", "gmp_imn"), ("batch", 1024)), "gmp_imn", 0.1, 1024, 1251, 1251)}
  for run in plan:   # the rest of each section is kept
    assert run.config.model["name"] == "VGG6"
    sgd = run.config.optimizer["euclidean"]
    assert sgd["name"] == "sgd" and sgd["momentum"] == 0.9
    assert run.config.checkpoint.keep == 3


def test_e2_config_is_the_papers_recipe():
  config = Config.from_dict({**e2_config.get_config("").to_dict(), "workdir": "/tmp/unused"})
  config.validate(num_devices=1)
  assert (config.model["name"], config.data["name"]) == ("VGG6", "imagenet_resized/32x32")
  sgd = config.optimizer["euclidean"]
  assert (sgd["name"], sgd["momentum"], sgd["nesterov"], config.learning_rate) == (
      "sgd", 0.9, False, 0.01)
  assert config.weight_decay == 0 and set(config.optimizer) == {"euclidean"}
  assert (config.schedule, config.plateau_patience, config.plateau_factor) == ("plateau", 5, 0.1)
  assert config.early_stopping_patience == 10 and config.num_epochs == 90
  assert config.restore_best and config.eval_batch_size == 1000
  lines = (pathlib.Path(_cli.REPO) / "experiments/flags/e2_vgg6.flags").read_text().splitlines()
  assert [l for l in lines if l.startswith("--")] == [
      "--config=experiments/configs/e2_vgg6.py", "--vgg_variants=sp,wn,wn_mbn,bn,gmp,gmp_imn",
      "--vgg_batch_sizes=256,512,1024", "--vgg_gmp_lr=0.1"]


def test_rows_carry_table_2_at_its_batch_sizes():
  records = [{"tags": {"variant": v, "batch": b}, "eval": {"top1": 0.4, "top5": 0.65}}
             for v in e2.VARIANTS for b in (256, 512, 1024, 64)]
  rows = {(r.setting["variant"], r.setting["batch"], r.metric): r for r in e2.rows_from(records)}
  assert len(rows) == len(records) * 2
  assert rows[("gmp_imn", 512, "top-1 (%)")].paper == 43.62
  assert rows[("gmp_imn", 512, "top-5 (%)")].paper == 67.76
  assert rows[("sp", 256, "top-1 (%)")].paper == 38.31
  assert rows[("bn", 1024, "top-5 (%)")].paper == 65.89
  assert rows[("wn_mbn", 1024, "top-1 (%)")].paper == 39.33
  assert rows[("gmp", 64, "top-1 (%)")].paper is None
  assert rows[("sp", 256, "top-1 (%)")].ours == [pytest.approx(40.0)]


def _png(path) -> bool:
  return path.read_bytes()[:8] == PNG and path.stat().st_size > 5000


def test_smoke_flagfile_end_to_end(tmp_path):
  workdir = tmp_path / "e2"
  proc = _cli.run("vgg6_imagenet32", SMOKE, f"--workdir={workdir}", timeout=400)
  results = json.loads((workdir / "results.json").read_text())
  rows = {(r["setting"]["variant"], r["setting"]["batch"], r["metric"]): r
          for r in results["rows"]}
  assert set(rows) == {(v, 8, m) for v in ("bn", "gmp_imn") for m in ("top-1 (%)", "top-5 (%)")}
  for key, row in rows.items():
    assert row["paper"] is None and "256/512/1024" in row["note"], key   # batch 8: no Table 2
    assert row["n"] == 1 and 0.0 <= row["ours"][0] <= 100.0
  # The variant's Table 2 row is printed beside ours in the notes.
  assert "Table 2, gmp_imn: top-1 43.14/43.62/42.70 at batch 256/512/1024" in results["notes"]
  assert "Table 2, bn: top-1 42.79/41.90/41.39 at batch 256/512/1024" in results["notes"]
  for variant, lr in (("bn", 0.01), ("gmp_imn", 0.1)):
    run = workdir / "runs" / f"variant={variant}/batch=8"
    record = json.loads((run / "result.json").read_text())
    assert record["final_step"] == 6 and record["eval"]["examples"] == 16
    assert all(math.isfinite(record["eval"][k]) for k in ("loss", "top1", "top5"))
    assert record["throughput"]["images_per_sec"] > 0
    config = json.loads((workdir / "results.json").read_text())["config"]
    assert config["model"]["name"] == "VGG6"
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in logged if r["split"] == "eval"}) == [4, 6]  # epoch = 4
    assert sorted(int(p) for p in os.listdir(run / "checkpoints") if p.isdigit()) == [4, 6]
  for name in ("e2_accuracy.png", "e2_curves.png"):
    assert _png(workdir / name), name
    assert f"Plot: {workdir / name}" in proc.stdout


def test_missing_imagenet32_stops_with_the_data_modules_message(tmp_path):
  empty = tmp_path / "tensorflow_datasets"
  empty.mkdir()
  proc = _cli.run("vgg6_imagenet32", "--flagfile=experiments/flags/e2_vgg6.flags",
                  f"--workdir={tmp_path / 'e2'}", f"--config.data.data_dir={empty}",
                  "--config.data.download=false", check=False, timeout=180)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert f"error: imagenet_resized/32x32 is not prepared in {empty}" in proc.stderr
  assert f"tfds build imagenet_resized/32x32 --data_dir={empty}" in proc.stderr
  assert not (tmp_path / "e2" / "runs").exists()


@pytest.mark.parametrize("flag, message", [
    ("--vgg_variants=bn,resnet", "--vgg_variants=bn,resnet: unknown 'resnet'"),
    ("--vgg_batch_sizes=8,big", "--vgg_batch_sizes=8,big: 'big' is not an integer"),
    ("--config=experiments/configs/e1_resnet50.py:bn,smoke",
     "config.model.name='ResNet': E2 needs 'VGG6'"),
])
def test_bad_flags_fail_fast_with_one_line(tmp_path, flag, message):
  proc = _cli.forked("vgg6_imagenet32", SMOKE, f"--workdir={tmp_path}", flag)
  assert proc.returncode == 2, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: {message}"), last
  assert not (tmp_path / "runs").exists()


def test_smoke_plots_say_they_ran_on_fake_data():
  config = Config.from_dict({**e2_config.get_config("smoke").to_dict(), "workdir": "w"})
  for title in e2.plot_titles(config.data["name"]):
    assert "on FAKE data (random images: a smoke test, the numbers mean nothing)" in title
  for title in e2.plot_titles("imagenet_resized/32x32"):
    assert "on imagenet_resized/32x32" in title and "FAKE" not in title
