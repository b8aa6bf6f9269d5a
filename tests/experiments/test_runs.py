"""A run of an experiment (``experiments._harness.runs``): trained once, read back, and
what the console says about its checkpoints without ``--verbose``."""

from __future__ import annotations

import json

from experiments._harness import runs
from orthojax.train.config import Config

_CONFIG = Config(model={"name": "MLP", "variant": "sp", "hidden": 16}, data={"name": "digits"},
                 batch_size=32, num_steps=8, log_every=4, checkpoint={"every_steps": 4},
                 optimizer={"euclidean": {"name": "adam", "learning_rate": 3e-3}}, seed=1)


def _execute(run, workdir):
  printed = []
  record = runs.execute(run, str(workdir), print_fn=printed.append)
  return record, printed


def test_a_damaged_checkpoint_is_reported_without_verbose_and_a_finished_run_read_back(
    tmp_path):
  run = runs.Run(tags=(("variant", "sp"),), config=_CONFIG)
  first, _ = _execute(run, tmp_path)
  again, printed = _execute(run, tmp_path)
  assert again == first and printed == [f"  variant=sp: done earlier ({runs._summary(first)})"]
  # Damage the newest checkpoint of an unfinished run: the rerun says so, then resumes.
  (tmp_path / "runs" / "variant=sp" / "result.json").unlink()
  step_dir = tmp_path / "runs" / "variant=sp" / "checkpoints" / "8"
  data = max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  flipped = bytearray(data.read_bytes())
  flipped[len(flipped) // 2] ^= 0x01
  data.write_bytes(bytes(flipped))
  record, printed = _execute(run, tmp_path)
  assert any(line.startswith("Checkpoint step 8") and "not usable" in line
             for line in printed), printed
  assert any(line.startswith("  moved to") for line in printed), printed
  assert any(line.startswith("Resumed from") and "at step 4" in line for line in printed)
  assert record["final_step"] == 8
  assert json.loads((tmp_path / "runs" / "variant=sp" / "result.json").read_text())[
      "final_step"] == 8
