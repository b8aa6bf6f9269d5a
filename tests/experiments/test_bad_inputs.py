"""Bad input to every experiment, as a user types it: one line, no traceback, exit 2,
nothing written — before any data is loaded or anything is trained.

Each case runs the module as ``python -m experiments.<name> …`` on the smoke flagfile (or
the default config) plus one bad flag or config override, and checks stderr is exactly
one ``error: …`` line that names what to fix. The process is a fork of one that has done
the imports every experiment does (``_cli.forked``: the module, its flags and all after
the imports fresh in each case); one case also runs in a process of its own, and the two
must agree.
"""

from __future__ import annotations

import functools

import pytest

from experiments._harness import cli
from tests.experiments import _cli
from tests.experiments.test_lm import corpus_dir  # noqa: F401  (a session fixture)

TRAIN = ()
E1 = ("--flagfile=experiments/flags/resnet50_smoke.flags",)
E2 = ("--flagfile=experiments/flags/vgg6_smoke.flags",)
E3 = ("--flagfile=experiments/flags/uci_smoke.flags",)
E4 = ("--flagfile=experiments/flags/gmp_toys_smoke.flags",)
E5 = ("--flagfile=experiments/flags/critical_tanh_smoke.flags",)
E6 = ("--flagfile=experiments/flags/seq_mnist_smoke.flags",)
E7 = ("--flagfile=experiments/flags/deep_linear_smoke.flags",)

# (module, base flags, the bad input, a fragment the one line must contain)
CASES = [
    # experiments.train: every part of the config.
    ("train", TRAIN, "--config.model.name=ResNet51", "config.model.name='ResNet51': unknown"),
    ("train", TRAIN, "--config.model.variant=foo", "config.model.variant='foo'"),
    ("train", TRAIN, "--config.model.init=orthogonal",
     "--config.model.init=orthogonal: cannot set it (MLP takes no keyword 'init'"),
    ("train", TRAIN, "--config.modle.hidden=3", "cannot set it (the config has no such key; "
     "did you mean 'model'?)"),
    ("train", TRAIN, "--config.model.hidden=abc", "--config.model.hidden=abc"),
    ("train", TRAIN, "--config.data.name=digitz", "config.data.name='digitz': unknown"),
    ("train", TRAIN, "--config.data.flatten=maybe", "--config.data.flatten=maybe"),
    ("train", TRAIN, "--config.data.bogus=1", "--config.data.bogus=1: cannot set it"),
    ("train", TRAIN, "--flagfile=experiments/flags/nope.flags",
     "--flagfile=experiments/flags/nope.flags: cannot open it (No such file or directory)"),
    ("train", TRAIN, "--config.optimizer.euclidean.name=adamm",
     "config.optimizer.euclidean.name='adamm': unknown"),
    ("train", TRAIN, "--config.optimizer.euclidean.b1=abc", "--config.optimizer.euclidean.b1=abc"),
    ("train", TRAIN, "--config.optimizer.euclidean.learning_rate=-1",
     "config.optimizer.euclidean.learning_rate=-1.0: must be > 0"),
    ("train", TRAIN, "--config.optimizer.euclidean.name=radam",   # the MLP has no manifold
     "config.optimizer.euclidean.name='radam': a manifold optimizer, for manifold parameters"),
    ("train", TRAIN, "--config.optimizer.stiefel.learning_rate=0.1",
     "name its constructor first: --config.optimizer.stiefel.name=NAME"),
    ("train", TRAIN, "--config.optimizer.manifold.retraction=qr",
     "renamed config.optimizer.stiefel.manifold.retraction or "
     "config.optimizer.oblique.manifold.retraction"),
    ("train", TRAIN, "--config.optimizer.learning_rate=0.1",
     "the optimizer is per parameter group: config.optimizer.euclidean.learning_rate"),
    ("train", TRAIN, "--config.penalty.kind=so",   # creates the section; strength is required
     "config.penalty.strength: add_orthogonality_penalty needs it"),
    ("train", TRAIN, "--config.batch_size=0", "config.batch_size=0: must be > 0"),
    ("train", TRAIN, "--config.mesh.split_above=-1",
     "config.mesh.split_above=-1: must be a number > 0"),
    ("train", TRAIN, "--config.batch_size=12", "config.batch_size=12: not divisible by the 8"),
    ("train", TRAIN, "--config.eval_batch_size=7", "config.eval_batch_size"),
    ("train", TRAIN, "--config.grad_accum_steps=3", "config.grad_accum_steps=3"),
    ("train", TRAIN, "--config.num_steps=0", "config.num_steps / config.num_epochs"),
    ("train", TRAIN, "--config.schedule=linear", "config.schedule='linear': unknown"),
    ("train", TRAIN, "--config.schedule=step", "config.decay_boundaries"),
    ("train", TRAIN, "--config.schedule=plateau", "config.eval_every"),
    ("train", TRAIN, "--config.loss=hinge", "config.loss='hinge': unknown"),
    ("train", TRAIN, "--config.loss=mse", "config.loss='mse'"),
    ("train", TRAIN, "--config.final_eval_splits=validation",
     "config.final_eval_splits"),
    ("train", TRAIN, "--config.compute_dtype=float16", "config.compute_dtype='float16'"),
    ("train", TRAIN, "--config.nan_policy=ignore", "config.nan_policy='ignore'"),
    ("train", TRAIN, "--config.max_skipped_fraction=2", "config.max_skipped_fraction=2"),
    ("train", TRAIN, "--config.mesh.data=3", "config.mesh.data=3"),
    ("train", TRAIN, "--config.mesh.fsdp=0", "config.mesh.fsdp=0"),
    ("train", TRAIN, "--config.checkpoint.keep=0", "config.checkpoint.keep=0"),
    ("train", TRAIN, "--config=experiments/configs/nope.py", "cannot load it"),
    ("train", TRAIN, "--bogus=1", "Unknown command line flag 'bogus'"),
    ("train", TRAIN, "--config.data.name=uci/concrete --config.data.data_dir={tmp} "
     "--config.loss=mse", "uci/concrete: no local file"),
    # E1 ResNet-50.
    ("resnet50", E1, "--config.model.norm=layer", "config.model.norm='layer'"),
    ("resnet50", E1, "--config.model.name=ResNet51", "config.model.name='ResNet51': unknown"),
    ("resnet50", E1, "--config.model.depth=51", "config.model.depth"),
    # E2 VGG-6.
    ("vgg6_imagenet32", E2, "--vgg_variants=foo", "--vgg_variants=foo"),
    ("vgg6_imagenet32", E2, "--vgg_batch_sizes=a", "--vgg_batch_sizes=a"),
    ("vgg6_imagenet32", E2, "--vgg_gmp_lr=0", "--vgg_gmp_lr=0"),
    # E3 UCI.
    ("uci", E3, "--uci_datasets=foo", "--uci_datasets=foo"),
    ("uci", E3, "--variants=foo", "--variants=foo"),
    ("uci", E3, "--num_splits=0", "--num_splits=0"),
    ("uci", E3, "--protocol=bogus", "--protocol"),
    ("uci", E3, "--config.model.variant=gmp", "config.model.variant"),
    ("uci", E3, "--gmp_lr=-1", "--gmp_lr=-1"),
    # E4 GmP toys.
    ("gmp_toys", E4, "--toys=foo", "--toys=foo"),
    ("gmp_toys", E4, "--levy_options=bogus=1", "--levy_options"),
    ("gmp_toys", E4, "--toy_lrs=abc", "--toy_lrs"),
    # E5 critical tanh.
    ("critical_tanh", E5, "--q_stars=abc", "--q_stars=abc"),
    ("critical_tanh", E5, "--weight_kinds=sphere", "--weight_kinds=sphere"),
    ("critical_tanh", E5, "--diagnostic_batch=0", "--diagnostic_batch=0"),
    ("critical_tanh", E5, "--config.model.q_star=0.5", "config.model.q_star"),
    # E6 sequential MNIST.
    ("seq_mnist", E6, "--variants=foo", "--variants=foo"),
    ("seq_mnist", E6, "--penalty_strengths=abc", "--penalty_strengths"),
    ("seq_mnist", E6, "--config.data.view=diagonal", "view"),
    # E7 deep linear.
    ("deep_linear", E7, "--depths=1", "--depths=1"),
    ("deep_linear", E7, "--inits=foo", "--inits=foo"),
    ("deep_linear", E7, "--lr_scaling=foo", "--lr_scaling"),
]
# Paths, in every module: checked before anything is loaded ({file}: an existing file).
_MODULES = {"train": TRAIN, "resnet50": E1, "vgg6_imagenet32": E2, "uci": E3, "gmp_toys": E4,
            "critical_tanh": E5, "seq_mnist": E6, "deep_linear": E7}
CASES += [(m, base, "--workdir={file}", "--workdir={file}: is a file")
          for m, base in _MODULES.items()]
CASES += [(m, base, "--workdir={file}/sub", "lies under a file") for m, base in _MODULES.items()]
CASES += [(m, (), "--flagfile=experiments/flags/nope.flags",
           "--flagfile=experiments/flags/nope.flags: cannot open it")
          for m in _MODULES if m != "train"]   # train's is above


@pytest.mark.parametrize("module,base,bad,fragment", CASES,
                         ids=[f"{m}:{b}" for m, _, b, _ in CASES])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, module, base, bad, fragment):
  _check(_cli.forked, tmp_path, module, base, bad, fragment)


def test_a_process_of_its_own_says_the_same_as_a_fork(tmp_path):
  """``_cli.forked`` stands for ``python -m``: the same case, both ways, the same result."""
  case = ("train", TRAIN, "--config.batch_size=12", "config.batch_size=12: not divisible")
  (tmp_path / "alone").mkdir()
  (tmp_path / "forked").mkdir()
  alone = _check(functools.partial(_cli.run, check=False), tmp_path / "alone", *case)
  forked = _check(_cli.forked, tmp_path / "forked", *case)
  assert (forked.returncode, forked.stdout, forked.stderr) == (
      alone.returncode, alone.stdout, alone.stderr)


def _check(run, tmp_path, module, base, bad, fragment):
  workdir = tmp_path / "w"
  a_file = tmp_path / "a_file"
  a_file.write_text("not a directory")
  bad = bad.replace("{tmp}", str(tmp_path / "no_data")).replace("{file}", str(a_file))
  fragment = fragment.replace("{file}", str(a_file))
  bad = bad.split(" ")
  proc = run(module, *base, f"--workdir={workdir}", *bad, devices=8, timeout=300)
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  assert fragment in lines[0], lines[0]
  assert not workdir.exists() or not any(workdir.iterdir()), list(workdir.iterdir())
  return proc


def test_at_least_forty_bad_inputs_across_every_experiment():
  assert len(CASES) >= 60
  assert {m for m, *_ in CASES} == {"train", "resnet50", "vgg6_imagenet32", "uci", "gmp_toys",
                                    "critical_tanh", "seq_mnist", "deep_linear"}


def test_a_workdir_without_write_permission_is_one_line(tmp_path, monkeypatch, capsys):
  # Simulated (the tests may run as root, whom a read-only directory does not stop).
  monkeypatch.setattr(cli.os, "access", lambda path, mode: False)
  with pytest.raises(SystemExit) as e:
    cli.check_workdir(str(tmp_path / "new" / "w"))
  assert e.value.code == 2
  assert capsys.readouterr().err == (f"error: --workdir={tmp_path}/new/w: cannot write in "
                                     f"{tmp_path} (permission denied); give a directory you "
                                     f"can write\n")


# A finished run is reused only for the config that produced it: the same command rerun
# reads it back; with another model it stops in one line naming the key, exit 2, before
# the header and before any run trains, and the workdir keeps its report
# (experiments._harness.fingerprints; the unit cases — keys that may differ, a record from
# before the check, the probe's cells, included workdirs — in test_runs.py and
# test_harness_stages.py).


def _refused(proc, run_dir, diff):
  """``proc`` stopped in one line: the run in ``run_dir`` is of another config (``diff``)."""
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert errors == [f"error: {run_dir}: its finished run {diff}; rerun with that config or "
                    f"use a new --workdir"], proc.stderr[-2000:]
  assert "runs (" not in proc.stdout and "Report:" not in proc.stdout   # no header, no report


def test_e8_reruns_its_finished_run_only_with_its_config(tmp_path, corpus_dir):  # noqa: F811
  """The 2 × 32 AdamW run, then the same command with a width of 64 (refused, naming
  config.model.width), then the same command again (read back)."""
  workdir = tmp_path / "e8"
  args = ("--flagfile=experiments/flags/lm_smoke.flags",
          f"--config.data.data_dir={corpus_dir}", "--config.data.download=false",
          "--stages=train", "--num_seeds=1", "--arms=adamw", f"--workdir={workdir}")
  _cli.run("lm", *args)
  report = (workdir / "report.md").read_text()
  wide = _cli.forked("lm", *args, "--config.model.width=64")
  _refused(wide, workdir / "runs/arm=adamw/seed=0",
           "(step 40) is of another config: config.model.width=64 (finished run: 32)")
  assert (workdir / "report.md").read_text() == report   # the report stays the 2 × 32 run's
  same = _cli.forked("lm", *args)
  assert same.returncode == 0, same.stderr[-2000:]
  assert "arm=adamw/seed=0: done earlier (step 40, test loss" in same.stdout


def test_e3_reruns_its_finished_run_only_with_its_config(tmp_path):
  """E3 (UCI) likewise: a hidden layer of 64 against the finished run's 100."""
  workdir = tmp_path / "uci"
  args = ("--flagfile=experiments/flags/uci_smoke.flags", "--variants=sp", "--num_splits=1",
          f"--workdir={workdir}")
  _cli.run("uci", *args)
  wide, same = _cli.run_each("uci", [(*args, "--config.model.hidden=64"), args])
  _refused(wide, workdir / "runs/dataset=boston/variant=sp/split=0",
           "(step 30) is of another config: config.model.hidden=64 (finished run: 100)")
  assert same.returncode == 0, same.stderr[-2000:]
  assert "dataset=boston/variant=sp/split=0: done earlier" in same.stdout
