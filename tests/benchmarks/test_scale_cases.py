"""The scale benchmark's conv-optimizer cases are flagfile configs that build."""

from __future__ import annotations

import pytest

from benchmarks import scale_bench
from orthojax.train import optimizers


@pytest.mark.parametrize("kind", sorted(scale_bench.CONV_OPTIMIZERS))
def test_conv_optimizer_cases_are_configs_that_build(kind):
  config = scale_bench.flagfile_config("e1_resnet50_bn.flags",
                                       *scale_bench.CONV_OPTIMIZERS[kind])
  assert config.model["weights"] == "stiefel"
  assert config.optimizer["stiefel"]["name"] == kind.removesuffix("_qr")
  if kind.startswith("radam"):
    assert config.optimizer["stiefel"]["manifold"]["retraction"] == (
        "qr" if kind.endswith("_qr") else "cayley")
  assert config.optimizer["euclidean"]["name"] == "sgd"   # the flagfile's, unchanged
  # The trainer's chain for a model with Stiefel conv kernels and Euclidean rest.
  optimizers.build(config, total_steps=10, labels={"conv": "stiefel", "head": "euclidean"})


def test_every_judged_pair_names_two_cases(monkeypatch):
  """Each ratio the suite judges (issue targets, split and CholeskyQR rows) compares two
  cases the suite compiles, on the same topology."""
  monkeypatch.setattr(scale_bench, "_cuda_plugin", lambda: True)
  names = {name: topo for name, _, topo, _ in scale_bench._cases(quick=False)}
  pairs = scale_bench._pairs()
  assert any(a.endswith(" split") for a, *_ in pairs)
  for case, baseline, *_ in pairs:
    assert case in names and baseline in names, (case, baseline)
    assert names[case] == names[baseline]


def test_the_chips_table_names_cases_the_suite_compiles():
  """Every (topology, batch, optimizer) cell of the chip-count table is a case, on the
  topology the table puts it at, at 1 and 256 images per chip."""
  names = {name: (topo, config.batch_size)
           for name, config, topo, _ in scale_bench._cases(quick=False)}
  for topo, chips, big in scale_bench.CHIP_COUNTS:
    for tail, batch in (("", 256), (f" {big}", 256 * chips)):
      for case in [f"E1 bn {topo}{tail}"] + [
          f"E1 bn {scale_bench.CONV_KINDS[k]} convs {topo}{tail}" for k in ("radam", "muon")]:
        assert names.get(case) == (topo, batch), case


def test_only_selects_by_name_or_part_in_the_order_it_names_them():
  cases = [("E1 bn v5e:4x4",), ("E1 bn v5e:4x4 b4096",), ("E1 bn v5e:16x16",), ("E5 x",)]
  assert scale_bench.selected(cases, "v5e:16x16,E1 bn v5e:4x4") == [
      ("E1 bn v5e:16x16",), ("E1 bn v5e:4x4",)]       # an exact name selects itself only
  assert scale_bench.selected(cases, "E5,bn") == [("E5 x",)] + cases[:3]
  assert scale_bench.selected(cases, None) == cases
