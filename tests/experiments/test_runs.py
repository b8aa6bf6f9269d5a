"""A run of an experiment (``experiments._harness.runs``): trained once, read back, and
what the console says about its checkpoints without ``--verbose``."""

from __future__ import annotations

import json

import pytest

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


def test_a_finished_run_is_reused_only_for_its_own_config(tmp_path, capsys):
  """Read back for its config (where it logs and saves may differ); another config, or a
  record from before the check with no config beside it, is one line and exit 2, and the
  run stays as it was."""
  run = runs.Run(tags=(("variant", "sp"),), config=_CONFIG)
  first, _ = _execute(run, tmp_path)
  run_dir = tmp_path / "runs" / "variant=sp"
  assert first["fingerprint"] == _CONFIG.replace(workdir=str(run_dir)).to_dict()
  moved = runs.Run(tags=run.tags, config=_CONFIG.replace(log_every=2, mesh={"data": 1}))
  assert _execute(moved, tmp_path)[1][0].endswith("done earlier (" + runs._summary(first) + ")")
  saved = (run_dir / "result.json").read_text()
  for changes, diff in (({"model": {"hidden": 32}}, "config.model.hidden=32 (finished run: 16)"),
                        ({"num_steps": 16}, "config.num_steps=16 (finished run: 8)"),
                        ({"eval_every": 4}, "config.eval_every=4 (finished run: 0)")):
    other = runs.Run(tags=run.tags, config=_CONFIG.replace(**changes))
    with pytest.raises(SystemExit) as exit_:
      _execute(other, tmp_path)
    line = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "\n" not in line
    assert line == (f"error: {run_dir}: its finished run (step 8) is of another config: {diff}; "
                    f"rerun with that config or use a new --workdir")
  assert (run_dir / "result.json").read_text() == saved
  # Written before the check: the trainer's config.json beside it stands in, else refused.
  record = json.loads(saved)
  del record["fingerprint"]
  (run_dir / "result.json").write_text(json.dumps(record))
  assert "done earlier" in _execute(run, tmp_path)[1][0]
  (run_dir / "config.json").unlink()
  with pytest.raises(SystemExit):
    _execute(run, tmp_path)
  assert capsys.readouterr().err.strip() == (
      f"error: {run_dir}: its finished run (step 8) predates the config check (no config "
      f"recorded with it); use a new --workdir")
