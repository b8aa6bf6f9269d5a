"""Pod scale without a pod: the flagship jobs compiled for TPU topologies with libtpu.

Each case builds a paper flagfile's exact train and eval steps with the
trainer's own code and compiles them for a TPU topology
(:func:`orthojax.train.aot.compile_for`): per-chip HBM against the chip's,
FLOPs per example against an analytic count, collectives, the roofline bound.
Cases (``quick``: the four overhead cases; a ResNet-50 compile takes 2–5
minutes on 2 cores, 20 with radam on every conv kernel):

* E1 ResNet-50 bn / gmp_imn / wn_mbn at the paper's global batch 256, bf16, on
  ``v5e:4x4``, ``v5e:8x8``, ``v4:2x2x4``; bn with radam (Stiefel, iterative
  Cayley) and with Muon on every conv kernel; bn on an fsdp mesh; bn on 2 × v5e-16;
* E2 VGG-6 on ImageNet32 at batch 256 (``v5e:2x4``: its eval batch of 1000
  does not split over 16 chips);
* E5 200 × 400 tanh at batch 1000, Euclidean SGD and Stiefel radam (``v5e:2x4``).

The analytic count is independent of XLA's cost model: the matmul and
convolution FLOPs of the model's forward jaxpr (``2 × output × contracted``,
scans times their length), times 3 for forward + backward, less the first
layer's input gradient, which is never computed.

Targets (on every backend: these are compile-time counts, not timings):
FLOPs per example within 5 % of the analytic count (ResNet-50, E5 Euclidean);
radam / SGD ≤ 1.15 and Muon / SGD ≤ 1.05 in FLOPs and in bytes accessed;
gmp_imn / bn ≤ 1.05 in FLOPs and bytes; 4-way fsdp argument bytes ≤ 0.3 × data's.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any, Callable

import jax
from absl import flags
from flax import nnx

import orthojax as oj
from benchmarks._harness import Row
from benchmarks._harness import Target
from benchmarks._harness import row
from orthojax.train import aot
from orthojax.train import data as data_lib
from orthojax.train import flags as train_flags
from orthojax.train import model_zoo
from orthojax.train import optimizers

SUITE = "scale"
FLAGS_DIR = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "flags"
WITHIN_5 = Target("<=", 0.05)
REPORTS: dict[str, aot.CompileReport] = {}   # name -> report, for docs/scale.md
ANALYTIC: dict[str, float] = {}               # name -> analytic train FLOPs per example


def flagfile_config(name: str, *overrides: str):
  """The training config of an experiment flagfile (its experiment-only flags left out)."""
  fv = flags.FlagValues()
  train_flags.define_flags(fv)
  lines = fv.read_flags_from_files([f"--flagfile={FLAGS_DIR / name}"], force_gnu=False)
  known = [a for a in lines if a.lstrip("-").split("=")[0].removeprefix("no") in fv]
  fv([SUITE, *known, "--checkpoint_every=0", *overrides])
  return train_flags.config_from_flags(fv)


def _conv_kernels(params):
  return jax.tree.map(lambda p: "conv" if p.ndim == 4 else "rest", params)


def conv_optimizer(kind: str, config) -> Callable[[Any], Any]:
  """Every conv kernel on ``kind`` (radam-Cayley or Muon), the rest on the flagfile's chain."""
  def build(model):
    del model   # conv kernels are labelled by rank when the chain is initialised
    rest = optimizers.build(config, total_steps=1000)
    if kind == "radam":
      conv = oj.optim.radam(1e-3, oj.manifolds.Stiefel("cayley", cayley_iterations=2),
                            reorthonormalize_every=100)
    else:
      conv = oj.optim.muon(0.02)
    return oj.optim.partition(_conv_kernels, conv=conv, rest=rest)
  return build


def forward_matmul_flops(config, info) -> float:
  """``2 × output × contracted`` over the convolutions and dot products of the
  model's forward jaxpr (per example), scans counted ``length`` times."""
  model = model_zoo.build(config, info, nnx.Rngs(0))
  model.eval()
  graphdef, state = nnx.split(model)
  x = jax.ShapeDtypeStruct((1,) + tuple(info.input_shape), jax.numpy.float32)
  jaxpr = jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, s)(x))(state, x)
  return _jaxpr_flops(jaxpr.jaxpr)


def _jaxpr_flops(jaxpr, times: int = 1) -> float:
  total = 0.0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)
    elif eqn.primitive.name == "conv_general_dilated":
      kernel = eqn.invars[1].aval.shape
      out_features = kernel[eqn.params["dimension_numbers"].rhs_spec[0]]
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(kernel) / out_features
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else (value,):
        sub = getattr(sub, "jaxpr", sub)   # a ClosedJaxpr's Jaxpr
        if hasattr(sub, "eqns"):
          total += _jaxpr_flops(sub, eqn.params.get("length", 1))
  return total * times


def _first_layer_flops(config, info) -> float:
  """The forward FLOPs of the first layer: its input gradient is never computed."""
  features = math.prod(info.input_shape)
  if config.model.startswith("resnet"):   # the 7x7/2 stem: 64 kernels over 112² outputs
    side = info.input_shape[0] // 2
    return 2.0 * side * side * 7 * 7 * info.input_shape[-1] * 64
  return 2.0 * features * (config.width or 100)


def analytic_train_flops(config, info) -> float:
  return 3 * forward_matmul_flops(config, info) - _first_layer_flops(config, info)


def _cases(quick: bool):
  e1 = lambda norm, *o: flagfile_config(f"e1_resnet50_{norm}.flags", "--compute_dtype=bfloat16",
                                        "--checkpoint_every=0", *o)
  e5 = lambda *o: flagfile_config("critical_tanh.flags", "--compute_dtype=bfloat16", *o)
  # The overhead targets, at 256 images per chip (the per-chip batch TPU recipes
  # use; global 4096 on 16 chips): the optimizer's work per chip does not shrink
  # with the batch, the network's does.
  big = ("--batch_size=4096", "--lr=1.6")
  yield "E1 bn v5e:4x4 b4096", e1("bn", *big), "v5e:4x4", {}
  yield "E1 bn muon convs v5e:4x4 b4096", e1("bn", *big), "v5e:4x4", {"optimizer": "muon"}
  yield "E1 gmp_imn v5e:4x4 b4096", e1("gmp_imn", *big), "v5e:4x4", {}
  yield "E1 bn radam-cayley convs v5e:4x4 b4096", e1("bn", *big), "v5e:4x4", {"optimizer": "radam"}
  if quick:
    return
  # The paper's global batch, 256: does it fit, and what does it cost per example.
  yield "E1 bn v5e:4x4", e1("bn"), "v5e:4x4", {}
  yield "E1 bn radam-cayley convs v5e:4x4", e1("bn"), "v5e:4x4", {"optimizer": "radam"}
  yield "E1 bn muon convs v5e:4x4", e1("bn"), "v5e:4x4", {"optimizer": "muon"}
  yield "E1 gmp_imn v5e:4x4", e1("gmp_imn"), "v5e:4x4", {}
  yield "E1 wn_mbn v5e:4x4", e1("wn_mbn"), "v5e:4x4", {}
  # E5's batch of 1000 and E2's eval batch of 1000 split over 8 chips, not 16.
  yield "E5 euclidean v5e:2x4", e5("--weights=euclidean", "--optimizer=sgd"), "v5e:2x4", {}
  yield "E5 stiefel radam v5e:2x4", e5("--weights=stiefel", "--optimizer=radam"), "v5e:2x4", {}
  yield "E2 vgg6 v5e:2x4", flagfile_config("e2_vgg6.flags", "--compute_dtype=bfloat16"), \
      "v5e:2x4", {}
  yield "E1 bn fsdp v5e:4x4", e1("bn", "--mesh_data=1", "--mesh_fsdp=-1"), "v5e:4x4", {}
  yield "E1 bn 2 slices v5e:4x4", e1("bn"), "v5e:4x4", {"num_slices": 2}
  for topo in ("v5e:8x8", "v4:2x2x4"):
    for norm in ("bn", "gmp_imn", "wn_mbn"):
      yield f"E1 {norm} {topo}", e1(norm), topo, {}
  if _cuda_plugin():   # the gpu-compile extra: deviceless H100 compiles
    yield "E1 bn h100:1x1x8", e1("bn"), "h100:1x1x8", {}
    yield "E1 gmp_imn h100:1x1x8", e1("gmp_imn"), "h100:1x1x8", {}
    yield "E5 euclidean h100:1x1x8", e5("--weights=euclidean", "--optimizer=sgd"), "h100:1x1x8", {}


def _cuda_plugin() -> bool:
  try:
    import jax_plugins.xla_cuda12  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


def run(quick: bool = False, on_report: Callable[[str, aot.CompileReport], None] | None = None,
        only: str | None = None) -> list[Row]:
  """Compile every case (``only``: those whose name contains it) into rows."""
  rows = []
  for name, config, topo, how in _cases(quick and not only):
    if only and only not in name:
      continue
    optimizer = conv_optimizer(how["optimizer"], config) if "optimizer" in how else None
    report = aot.compile_for(config, topo, num_slices=how.get("num_slices"),
                             optimizer=optimizer)
    REPORTS[name] = report
    if on_report:
      on_report(name, report)
    info = data_lib.dataset_info(config.dataset, published=True, **config.options)
    gib = max(report.train.memory["total"], report.eval.memory["total"]) / 2 ** 30
    rows.append(row(SUITE, f"{name}: HBM per chip / capacity", gib / (report.chip.hbm_bytes / 2 ** 30),
                    "x", Target("<=", 1.0), note=f"{gib:.2f} GiB, batch {report.global_batch}"))
    rows.append(row(SUITE, f"{name}: GFLOP per example", report.flops_per_example / 1e9, "GFLOP",
                    note=f"roofline ≤ {report.examples_per_sec_per_chip_bound:.0f} ex/s/chip "
                         f"({report.bound_by}); compile {report.compile_seconds:.0f} s"))
    if "optimizer" not in how and (config.model.startswith("resnet") or
                                   config.weights == "euclidean"):
      analytic = ANALYTIC[name] = analytic_train_flops(config, info)
      rows.append(row(SUITE, f"{name}: |FLOPs / analytic − 1|",
                      abs(report.flops_per_example / analytic - 1), "", WITHIN_5,
                      note=f"analytic {analytic / 1e9:.4g} GFLOP per example"))
  rows += _ratios()
  return rows


def _ratios() -> list[Row]:
  out = []
  pairs = [("E1 bn radam-cayley convs v5e:4x4 b4096", "E1 bn v5e:4x4 b4096", 1.15),
           ("E1 bn muon convs v5e:4x4 b4096", "E1 bn v5e:4x4 b4096", 1.05),
           ("E1 gmp_imn v5e:4x4 b4096", "E1 bn v5e:4x4 b4096", 1.05)]
  for a, b, bound in pairs:
    if a in REPORTS and b in REPORTS:
      ra, rb = REPORTS[a].train, REPORTS[b].train
      extra = (f"extra per chip per step: {(ra.flops - rb.flops) / 1e9:.4g} GFLOP, "
               f"{(ra.bytes_accessed - rb.bytes_accessed) / 2 ** 30:.3g} GiB of HBM traffic, "
               f"{(ra.memory['total'] - rb.memory['total']) / 2 ** 30:.3g} GiB of HBM")
      for what, x, y in (("FLOPs", ra.flops, rb.flops),
                         ("bytes accessed", ra.bytes_accessed, rb.bytes_accessed)):
        out.append(row(SUITE, f"{a.split(' v5e')[0]} / bn (256 per chip), {what}", x / y, "x",
                       Target("<=", bound), note=extra))
  if "E1 bn fsdp v5e:4x4" in REPORTS:
    fsdp, data = REPORTS["E1 bn fsdp v5e:4x4"].train, REPORTS["E1 bn v5e:4x4"].train
    out.append(row(SUITE, "E1 bn fsdp-16 / data-16, argument bytes per chip",
                   fsdp.memory["arguments"] / data.memory["arguments"], "x", Target("<=", 0.3),
                   note=f"all-gathers {int(fsdp.collectives.get('all-gather', {}).get('count', 0))}"))
  return out


def markdown(reports: dict[str, aot.CompileReport], analytic: dict[str, float]) -> str:
  """One row per compiled job, as docs/scale.md shows them."""
  head = ("| job | topology | mesh (data × fsdp) | batch (global / chip) | HBM per chip, train "
          "(of capacity) | GFLOP per example (analytic) | HBM bytes per step per chip | "
          "collectives per step | roofline: examples/s per chip ≤ | compile (s) |")
  lines = [head, "|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|"]
  for name, r in reports.items():
    t = r.train
    coll = ", ".join(f"{k} {int(v['count'])}× ({v['bytes'] / 2 ** 20:.0f} MiB)"
                     for k, v in sorted(t.collectives.items())) or "—"
    flops = f"{r.flops_per_example / 1e9:.4g}"
    if name in analytic:
      flops += f" ({analytic[name] / 1e9:.4g})"
    slices = f" × {r.num_slices}" if r.num_slices > 1 else ""
    lines.append(
        f"| {name.rsplit(' ', 1)[0]} | {r.topology}{slices} | {r.mesh['data']} × {r.mesh['fsdp']} | "
        f"{r.global_batch} / {r.per_chip_batch:g} | {t.memory['total'] / 2 ** 30:.2f} GiB "
        f"({r.chip.hbm_bytes / 2 ** 30:.0f}) | {flops} | {t.bytes_accessed / 2 ** 30:.3g} GiB | "
        f"{coll} | {r.examples_per_sec_per_chip_bound:.4g} ({r.bound_by}) | "
        f"{r.compile_seconds:.0f} |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
  """``python -m benchmarks.scale_bench [--quick]``: compile every case, print the
  rows and the docs/scale.md table."""
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(prog="python -m benchmarks.scale_bench")
  parser.add_argument("--quick", action="store_true", help="the first four cases only")
  parser.add_argument("--only", help="only the cases whose name contains this string")
  parser.add_argument("--report_dir", type=pathlib.Path,
                      help="also write each case's compile_report.json under this folder")
  args = parser.parse_args(argv)
  def note(name: str, report: aot.CompileReport) -> None:
    print(f"{name}:\n{report.table()}\n", flush=True)
    if args.report_dir:
      args.report_dir.mkdir(parents=True, exist_ok=True)
      (args.report_dir / (name.replace(" ", "_").replace(":", "-") + ".json")).write_text(
          json.dumps(report.to_json(), indent=1, default=str))

  rows = run(args.quick, on_report=note, only=args.only)
  for r in rows:
    print(f"{r.case}: {r.value:.4g} {r.unit} {r.target} {r.status} {r.note}")
  print("\n" + markdown(REPORTS, ANALYTIC))


if __name__ == "__main__":
  main()
