"""An experiment in stages (``experiments._harness``: stages, rates, records): ``--stages``
checked, the probe → train rates file, the per-run record cache, included workdirs."""

from __future__ import annotations

import json
import math

import pytest

from experiments._harness import cli
from experiments._harness import probe
from experiments._harness import rates
from experiments._harness import records
from experiments._harness import runs
from experiments._harness import stages
from orthojax.train.config import Config
from orthojax.train.config import ConfigError

_ORDER = ("probe", "init", "train")
_CONFIG = Config(model={"name": "MLP", "variant": "sp", "hidden": 4}, data={"name": "digits"},
                 batch_size=8, num_steps=1,
                 optimizer={"euclidean": {"name": "adam", "learning_rate": 1e-3},
                            "stiefel": {"name": "radam", "learning_rate": 1e-3}})


def _run(arm: str, seed: int) -> runs.Run:
  return runs.Run(tags=(("arm", arm), ("seed", seed)), config=_CONFIG)


# ------------------------------------------------------------------ Stages --

def _stages(value):
  return stages.chosen_stages(value, _ORDER, default=("init", "train"))


def test_stages_come_in_the_experiments_order_and_default_when_empty():
  assert _stages(["train", "probe", "train"]) == ("probe", "train")
  assert _stages([]) == ("init", "train")


def test_an_unknown_stage_is_one_line_naming_the_flag_and_the_choices():
  with pytest.raises(ConfigError) as err:
    _stages(["init", "fit"])
  assert str(err.value) == "--stages=init,fit: unknown 'fit'; choose from probe, init, train"
  assert "\n" not in str(err.value)


# ------------------------------------------------------------- Record cache --

def test_a_record_is_measured_once_then_read_back(tmp_path):
  calls = []

  def measure():
    calls.append(1)
    return {"epoch": 0, "value": 0.25 * len(calls)}

  run = _run("adamw", 1)
  first = records.cached_record(str(tmp_path), "init", run, measure)
  path = tmp_path / "init" / "arm=adamw" / "seed=1.json"
  assert path.exists() and records.record_path(str(tmp_path), "init", run) == str(path)
  assert list(first) == ["tags", "epoch", "value", "seconds"]
  assert first["tags"] == {"arm": "adamw", "seed": 1} and first["value"] == 0.25
  again = records.cached_record(str(tmp_path), "init", run, measure)
  assert len(calls) == 1 and again == json.loads(path.read_text()) == first
  # What is on disk is what a later run reports (an edited record is not re-measured).
  path.write_text(json.dumps({**first, "value": 9.0}))
  assert records.cached_record(str(tmp_path), "init", run, measure)["value"] == 9.0
  assert len(calls) == 1
  # Another run of the grid is measured.
  records.cached_record(str(tmp_path), "init", _run("adamw", 2), measure)
  assert len(calls) == 2


# ------------------------------------------------------------- Rates file --

def _entry(rate):
  return {"rates": {"euclidean": rate}, "probes": {"euclidean": probe.best_rate(
      [rate / 10, rate, rate * 10], lambda r, rate=rate: -abs(r - rate)).entry()}}


def test_the_probe_writes_rates_that_the_train_stage_reads_back(tmp_path, capsys):
  probed = []
  found, path = rates.probe_cells(str(tmp_path), ["arm=adamw", "arm=muon"],
                                  lambda cell: probed.append(cell) or _entry(
                                      {"arm=adamw": 1e-3, "arm=muon": 2e-2}[cell]),
                                  rule={"steps": 50, "widen": 0}, config=_CONFIG)
  assert probed == ["arm=adamw", "arm=muon"]
  assert path == str(tmp_path / "probe" / "rates.json")
  assert json.loads((tmp_path / "probe" / "rates.json").read_text()) == found
  assert list(found) == ["steps", "widen", "fingerprint", "cells"]
  assert found["fingerprint"] == _CONFIG.to_dict()
  assert "probe 2/2 arm=muon: euclidean lr 0.02" in capsys.readouterr().out
  # --rates_from=<workdir> or its rates.json: the same rates, each run's config at them.
  for source in (str(tmp_path), path):
    read, where = rates.given_rates(source, ("train",), ["arm=muon"])
    assert (read, where) == (found, path)
  muon = rates.cell_rates(read, rates.cell_name((("arm", "muon"),)))
  config = rates.with_rates(_CONFIG, muon)
  assert config.optimizer["euclidean"] == {"name": "adam", "learning_rate": 2e-2}
  assert config.optimizer["stiefel"] == _CONFIG.optimizer["stiefel"]
  # Without the train stage, or without --rates_from, no rates.
  assert rates.given_rates(path, ("probe",), ["arm=muon"]) == (None, None)
  assert rates.given_rates(None, ("train",), ["arm=muon"]) == (None, None)


def _probe(workdir, cells, rate, rule, config=_CONFIG):
  return rates.probe_cells(str(workdir), cells, lambda c: _entry(rate), rule=rule,
                           config=config)


def test_a_probe_keeps_other_cells_only_under_the_same_rule(tmp_path):
  _probe(tmp_path, ["arm=adamw"], 1e-3, {"widen": 0})
  same, _ = _probe(tmp_path, ["arm=muon"], 2e-2, {"widen": 0},
                   _CONFIG.replace(log_every=7))   # how it logs may differ
  assert list(same["cells"]) == ["arm=adamw", "arm=muon"]
  other, _ = _probe(tmp_path, ["arm=muon"], 2e-2, {"widen": 3})
  assert list(other["cells"]) == ["arm=muon"]


def test_a_probe_cell_recorded_for_another_config_is_refused(tmp_path, capsys):
  """A cell the probe would keep (not probed now) from another config, or from a file
  written before the check: one line and exit 2 before any trial; the file stays."""
  _probe(tmp_path, ["arm=adamw", "arm=muon"], 1e-3, {"widen": 0})
  path = tmp_path / "probe" / "rates.json"
  saved = path.read_text()
  with pytest.raises(SystemExit) as exit_:
    rates.probe_cells(str(tmp_path), ["arm=adamw"], lambda c: pytest.fail("probed"),
                      rule={"widen": 0}, config=_CONFIG.replace(model={"hidden": 8}))
  assert exit_.value.code == 2 and path.read_text() == saved
  assert capsys.readouterr().err.strip() == (
      f"error: {path}: its probe of arm=muon is of another config: config.model.hidden=8 "
      f"(probe: 4); probe with that config or use a new --workdir")
  # Every earlier cell probed again: each trial is a run, checked on its own.
  again, _ = _probe(tmp_path, ["arm=adamw", "arm=muon"], 2e-3, {"widen": 0},
                    _CONFIG.replace(model={"hidden": 8}))
  assert again["fingerprint"]["model"]["hidden"] == 8
  earlier = json.loads(saved)
  del earlier["fingerprint"]
  path.write_text(json.dumps(earlier))
  with pytest.raises(SystemExit):
    _probe(tmp_path, ["arm=adamw"], 1e-3, {"widen": 0})
  assert "its probe of arm=muon predates the config check" in capsys.readouterr().err


def test_a_missing_cell_or_file_is_one_line_saying_what_to_run(tmp_path):
  _probe(tmp_path, ["arm=adamw"], 1e-3, {})
  with pytest.raises(ConfigError) as err:
    rates.read_rates(str(tmp_path), ["arm=adamw", "arm=muon"], hint="--stages=probe --arms=muon")
  path = tmp_path / "probe" / "rates.json"
  assert str(err.value) == (f"--rates_from={tmp_path}: {path} has no rates for arm=muon; "
                            f"probe those cells (--stages=probe --arms=muon)")
  with pytest.raises(ConfigError, match=r"--rates_from=/nonexistent: no /nonexistent; run "
                                        r"--stages=probe there first"):
    rates.given_rates("/nonexistent", ("train",), ["arm=muon"])
  (tmp_path / "bad.json").write_text("{")
  with pytest.raises(ConfigError, match="bad.json is not JSON"):
    rates.read_rates(str(tmp_path / "bad.json"), [])


def test_probed_rates_and_a_configured_rate_exclude_each_other(monkeypatch):
  with pytest.raises(ConfigError, match="--rates_from=r.json: --stages=probe picks this "
                                        "workdir's rates; drop one"):
    rates.check_rates_flags("r.json", ("probe", "train"), ["euclidean"])
  rates.check_rates_flags("r.json", ("train",), ["euclidean"])   # nothing set: fine
  monkeypatch.setattr(cli, "_OVERRIDES", ["--config.optimizer.euclidean.learning_rate=0.1"])
  with pytest.raises(ConfigError, match=r"config.optimizer.euclidean.learning_rate: each arm "
                                        r"trains at its probed rates \(--rates_from\)"):
    rates.check_rates_flags("r.json", ("train",), ["euclidean"], unit="arm")
  rates.check_rates_flags(None, ("train",), ["euclidean"])   # the config's rates: fine


def test_probe_groups_probes_each_group_at_the_rates_chosen_before_it():
  tried = []

  def score(at):   # the best muon rate is 1e-2, the best adam rate 1e-1
    tried.append(dict(at))
    return -abs(math.log10(at["muon"] / 1e-2)) - abs(math.log10(at["adam"] / 1e-1))

  entry = probe.probe_groups([("muon", [1e-3, 1e-2, 1e-1]), ("adam", [1e-2, 1e-1, 1.0])],
                             score, start={"adam": 3e-4, "other": 5.0}, widen=0)
  assert entry["rates"] == {"muon": 1e-2, "adam": 1e-1, "other": 5.0}
  assert list(entry["rates"]) == ["muon", "adam", "other"]
  assert [t["adam"] for t in tried[:3]] == [3e-4] * 3   # the start while muon is probed
  assert {t["muon"] for t in tried[3:]} == {1e-2}         # then adam at the chosen muon
  assert entry["probes"]["muon"]["scores"].keys() == {"0.001", "0.01", "0.1"}
  assert entry["probes"]["adam"]["best"] == 1e-1 and not entry["probes"]["adam"]["at_edge"]


def test_rates_notes_name_the_source_the_rule_and_each_probe():
  found = {"cells": {"arm=adamw": _entry(1e-3)}}
  lines = rates.rates_notes(found, "w/probe/rates.json", rule="best loss", unit="arm",
                            score="validation loss")
  assert lines[0] == "learning rates per arm from w/probe/rates.json: best loss"
  assert lines[1].startswith("probe arm=adamw, config.optimizer.euclidean.learning_rate "
                             "(validation loss): 0.0001 ")


# ----------------------------------------------------------- Included runs --

def _finished(workdir, experiment, *tags, config=_CONFIG):
  """A workdir with a finished report of ``experiment`` (its config ``config``) and a
  record per tags."""
  for arm, seed in tags:
    run = _run(arm, seed)
    runs.write_json(runs.result_path(run, str(workdir)),
                    {"tags": dict(run.tags), "v": seed, "fingerprint": _CONFIG.to_dict()})
  runs.write_json(str(workdir / "results.json"),
                  {"experiment": experiment, "notes": [f"training note of {workdir.name}"],
                   "config": config.replace(workdir=str(workdir)).to_dict()})


def test_included_workdirs_bring_their_runs_and_their_training_note(tmp_path):
  _finished(tmp_path / "a", "lm", ("muon", 1), ("muon", 0))
  _finished(tmp_path / "b", "lm", ("stiefel", 0))
  _finished(tmp_path / "b", "lm", ("stiefel", 0),   # at its own rates
            config=_CONFIG.replace(optimizer={"euclidean": {"learning_rate": 0.5}}))
  got, notes = records.included_records([str(tmp_path / "a"), str(tmp_path / "b")],
                                        [_run("adamw", 0)], config=_CONFIG, experiment="lm",
                                        label="E8")
  assert [r["tags"] for r in got] == [{"arm": "muon", "seed": 0}, {"arm": "muon", "seed": 1},
                                      {"arm": "stiefel", "seed": 0}]
  assert notes == [f"included from {tmp_path / 'a'}: training note of a",
                   f"included from {tmp_path / 'b'}: training note of b"]
  assert records.included_records([], [_run("adamw", 0)], config=_CONFIG, experiment="lm",
                                  label="E8") == ([], [])


@pytest.mark.parametrize("case, message", [
    ("duplicate", "arm arm=muon/seed=0 is in {b} and in another workdir of this report; "
                  "include it once"),
    ("own", "arm arm=muon/seed=0 is in {a} and in another workdir"),
    ("missing", "{none} has no finished E8 report (results.json)"),
    ("other", "{c} holds 'critical_tanh', not an E8 (lm) run"),
    ("config", "{d} was run with another config: config.model.hidden=4 ({d}: 8); include "
               "workdirs of this config"),
    ("predates", "{e}/runs/arm=muon/seed=2: its finished run predates the config check"),
])
def test_included_workdirs_refuse_a_run_twice_and_other_reports(tmp_path, case, message):
  a, b, c, d, e, none = (tmp_path / n for n in ("a", "b", "c", "d", "e", "none"))
  _finished(a, "lm", ("muon", 0))
  _finished(b, "lm", ("muon", 0))
  _finished(c, "critical_tanh", ("muon", 1))
  _finished(d, "lm", ("muon", 1), config=_CONFIG.replace(model={"hidden": 8}))
  _finished(e, "lm", ("muon", 1))
  runs.write_json(runs.result_path(_run("muon", 2), str(e)), {"tags": {"arm": "muon",
                                                                       "seed": 2}})
  workdirs, own = {"duplicate": ([a, b], []), "own": ([a], [_run("muon", 0)]),
                   "missing": ([a, none], []), "other": ([c], []), "config": ([d], []),
                   "predates": ([e], [])}[case]
  with pytest.raises(ConfigError) as err:
    records.included_records([str(w) for w in workdirs], own or [_run("adamw", 0)],
                             config=_CONFIG, experiment="lm", label="E8", unit="arm")
  text = str(err.value)
  assert text.startswith(f"--include_workdirs={','.join(map(str, workdirs))}: ")
  assert message.format(a=a, b=b, none=none, c=c, d=d, e=e) in text and "\n" not in text
