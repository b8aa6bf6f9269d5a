"""``--compile_for`` on every trainer-based experiment module, as a user runs it.

Each smoke flagfile compiles for a 2×2 v5e slice with libtpu: one table and one
``compile_report.json`` entry per distinct program of the experiment (runs that
differ only in seed or data split share one), nothing trained. Runs that their
experiment pins to one device (tiny full-batch ones) compile for one chip.
"""

from __future__ import annotations

import json
import re

import pytest

from orthojax.compile import topology
from tests.experiments import _cli

pytestmark = pytest.mark.skipif(not topology.libtpu_available(), reason="libtpu not installed")

# The image experiments' smoke programs at 8x8 instead of 32x32 images: the same programs
# (and counts) at a fraction of the TPU compile time.
_SMALL_IMAGES = ("--config.data.height=8", "--config.data.width=8")

# Grid axes that change only a run's initialisation or a constant of its program (E6's
# init variants, E4's inits, E5's q*) are narrowed to one value: a TPU compile each, the
# same code compiled again. The axes that change the program (architecture, penalty,
# depth, optimizer) are kept whole, and a seed axis where the flagfile has one.
# module, flagfile, extra flags, distinct programs, chips per program
CASES = [
    ("resnet50", "resnet50_smoke", _SMALL_IMAGES, 1, 4),
    ("vgg6_imagenet32", "vgg6_smoke", ("--vgg_variants=bn", *_SMALL_IMAGES), 1, 4),
    ("critical_tanh", "critical_tanh_smoke", ("--q_stars=0.5",), 2, 4),
    ("seq_mnist", "seq_mnist_smoke",
     ("--variants=orthogonal_gain,orthogonal_gain_so,orthogonal_gain_adj_so",), 3, 4),
    ("uci", "uci_smoke", (), 2, 1),
    ("deep_linear", "deep_linear_smoke", ("--inits=orthogonal",), 2, 1),
    ("gmp_toys", "gmp_toys_smoke", (), 4, 1),
    ("lm", "lm_smoke", ("--arms=adamw,muon,stiefel_muon",), 3, 4),
]


@pytest.mark.parametrize("module,flagfile,extra,programs,chips", CASES, ids=[c[0] for c in CASES])
def test_experiment_compiles_its_programs_and_trains_nothing(tmp_path, module, flagfile, extra,
                                                             programs, chips):
  workdir = tmp_path / "w"
  proc = _cli.run(module, f"--flagfile=experiments/flags/{flagfile}.flags",
                  "--compile_for=v5e:2x2", f"--workdir={workdir}", *extra)
  reports = json.loads((workdir / "compile_report.json").read_text())
  assert len(reports) == programs == proc.stdout.count("HBM per chip (train)")
  for report in reports.values():
    assert report["num_chips"] == chips and report["fits"]
    assert report["flops_per_example"] > 0
  assert sorted(p.name for p in workdir.iterdir()) == ["compile_report.json"]


def test_libtpu_keeps_its_info_lines_off_the_terminal_and_out_of_its_log(tmp_path, monkeypatch):
  """The compile check's stderr is empty; libtpu's log (TPU_LOG_DIR) holds warnings, no INFO
  banner (topology._quiet_libtpu sets its levels where the environment does not)."""
  logs = tmp_path / "tpu_logs"
  monkeypatch.setenv("TPU_LOG_DIR", str(logs))
  for name in ("TPU_STDERR_LOG_LEVEL", "TPU_MIN_LOG_LEVEL"):   # as a user's shell has them
    monkeypatch.delenv(name, raising=False)
  proc = _cli.run("train", "--config=experiments/configs/train.py", "--compile_for=v5e:2x2",
                  f"--workdir={tmp_path / 'w'}")
  assert "HBM per chip (train)" in proc.stdout
  assert proc.stderr == ""
  lines = [line for path in logs.iterdir() if not path.is_symlink()
           for line in path.read_text().splitlines()]
  assert any(line.startswith("W") for line in lines)      # libtpu did log, at WARNING
  assert not [line for line in lines if re.match(r"I\d{4} ", line)]
