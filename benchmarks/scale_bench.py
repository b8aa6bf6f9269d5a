"""Pod scale without a pod: the flagship jobs compiled for TPU topologies with libtpu.

Each case builds a paper flagfile's exact train and eval steps (its config file and
``--config.`` overrides, :func:`flagfile_config`) with the trainer's own code and compiles them for a TPU topology
(:func:`orthojax.compile.aot.compile_for`): per-chip HBM against the chip's,
FLOPs per example against an analytic count, collectives, the roofline bound.
The orthogonal optimizers are owner-sharded (``config.mesh.shard_update``, on
by default). Cases (``quick``: the four overhead cases at 256 images per chip;
a ResNet-50 compile takes 2–5 minutes on 2 cores, 15–40 with radam on every
conv kernel):

* E1 ResNet-50 bn / gmp_imn / wn_mbn at the paper's global batch 256, bf16, on
  ``v5e:4x4``, ``v5e:8x8``, ``v4:2x2x4``; bn with radam (Stiefel, iterative
  Cayley) and with Muon on every conv kernel, at the paper's batch and at 256
  images per chip, on ``v5e:4x4``, ``v5e:8x8`` (and ``h100:1x1x8`` with the
  ``gpu-compile`` extra); bn on an fsdp mesh; bn on 2 × v5e-16; bn, radam and Muon
  on ``v5e:16x16`` at both batches, for the optimizer's cost against the chip count
  (16, 64, 256: :func:`chips_table`);
* E2 VGG-6 on ImageNet32 at batch 256 (``v5e:2x4``: its eval batch of 1000
  does not split over 16 chips);
* E5 200 × 400 tanh as its experiment compiles it (float32; the Euclidean
  network on Adam, the Stiefel one on radam): batch 1000 on ``v5e:2x4`` and
  batch 2000 on ``v5e:4x4``.

The analytic count is independent of XLA's cost model: the matmul and
convolution FLOPs of the model's forward jaxpr (``2 × output × contracted``,
scans times their length), times 3 for forward + backward, less the first
layer's input gradient, which is never computed.

Targets (on every backend: these are compile-time counts, not timings):
FLOPs per example within 5 % of the analytic count (ResNet-50, E5 Euclidean);
gmp_imn / bn ≤ 1.05 in FLOPs and bytes; 4-way fsdp argument bytes ≤ 0.3 × data's;
the owner-sharded optimizers' overhead over bn (FLOPs and bytes accessed):
radam-Cayley ≤ 1.3 and Muon ≤ 1.15 at the paper's batch, ≤ 1.05 and ≤ 1.02 at
256 images per chip; E5 Stiefel / Euclidean ≤ 2.5 in FLOPs and ≤ 2.0 in bytes
at batch 1000 on 8 chips, ≤ 2.0 in FLOPs at batch 2000 on 16; the orthogonal
optimizers' state per chip ≤ 1.25 / N of the replicated state; no all-reduce
in the optimizer's scope (:class:`OwnerPlan` gives the state and the owners'
balance without compiling).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any, Callable

import jax
from absl import flags
from flax import nnx
from ml_collections import config_flags

import orthojax as oj
from benchmarks._harness import MISS
from benchmarks._harness import Row
from benchmarks._harness import Target
from benchmarks._harness import row
from orthojax.compile import aot
from orthojax.compile import topology as topology_lib
from orthojax.train import data as data_lib
from orthojax.train import model_zoo
from orthojax.train import overrides as overrides_lib
from orthojax.train.config import Config
from orthojax.train.program import build_program

SUITE = "scale"
REPO = pathlib.Path(__file__).resolve().parents[1]
FLAGS_DIR = REPO / "experiments" / "flags"
WITHIN_5 = Target("<=", 0.05)
REPORTS: dict[str, aot.CompileReport] = {}   # name -> report, for docs/scale.md
PLANS: dict[str, "OwnerPlan"] = {}            # name -> its owner-sharded update's plan
ANALYTIC: dict[str, float] = {}               # name -> analytic train FLOPs per example


def _is_config_arg(arg: str) -> bool:
  return arg.startswith(("--config=", "--config.", "--noconfig."))


def _from_repo(arg: str) -> str:
  """``--config=FILE[:ARG]`` with a relative FILE taken from the repository root."""
  path, sep, rest = arg[len("--config="):].partition(":")
  if not pathlib.Path(path).is_absolute():
    path = str(REPO / path)
  return f"--config={path}{sep}{rest}"


def flagfile_config(name: str, *overrides: str) -> Config:
  """The training config of an experiment flagfile, as the experiment builds it: the
  flagfile's ``--config=FILE[:ARG]`` line and ``--config.key=value`` lines, then
  ``--config.checkpoint.every_steps=0`` and ``overrides`` (``--config.key=value``), applied
  as the experiments apply them (:mod:`orthojax.train.overrides`); the experiment's own flags (``--q_stars``, …) are left
  out. Validated for no particular devices (the topology's are checked by the compile)."""
  fv = flags.FlagValues()
  lines = fv.read_flags_from_files([f"--flagfile={FLAGS_DIR / name}"], force_gnu=False)
  args = [a for a in lines if _is_config_arg(a)]
  if not any(a.startswith("--config=") for a in args):
    raise ValueError(f"{FLAGS_DIR / name}: no --config=FILE[:ARG] line")
  bad = [a for a in overrides if not a.startswith(("--config.", "--noconfig."))]
  if bad:
    raise ValueError(f"flagfile_config({name!r}): {bad[0]}: overrides are --config.key=value")
  files = [_from_repo(a) for a in args if a.startswith("--config=")]
  changes = [a for a in args if not a.startswith("--config=")]
  changes += ["--config.checkpoint.every_steps=0", *overrides]
  config_flags.DEFINE_config_file("config", None, "the training config", flag_values=fv,
                                  lock_config=True, sys_argv=[SUITE, files[-1]])
  fv([SUITE, files[-1]])
  tree = overrides_lib.apply_all(fv.config.to_dict(), changes)
  return Config.from_dict({**tree, "workdir": ""}).validate()


def e5_config(weights: str, *overrides: str) -> Config:
  """E5's network (``critical_tanh.flags``) with ``model.weights`` = ``weights``, as its
  experiment sets it per run: the Euclidean group on Adam (every parameter of a Euclidean
  network; a manifold network's scales, biases and classifier), the manifold group on
  Riemannian Adam, each at the flagfile's rate."""
  config = flagfile_config("critical_tanh.flags", *overrides)
  return config.replace(model={"weights": weights}).validate()


CONV_KINDS = {"radam": "radam-cayley", "radam_qr": "radam-qr", "muon": "muon"}
HOUSEHOLDER = "--config.optimizer.stiefel.manifold.qr_algorithm=householder"


CONV_OPTIMIZERS = {
    # Riemannian Adam with the iterative Cayley retraction (two iterations, Li et al.'s), and
    # the step between clean-ups: with reorthonormalize_every the
    # report would count the clean-up's branch on every step (a conditional by its costliest
    # branch) and its Newton-Schulz loop at its bound of 30 steps. Every 100 steps the clean-up
    # costs 4 n p^2 per Newton-Schulz step per kernel (43.4 GFLOP over ResNet-50's 53) and
    # takes 2-3 steps after 100 steps' drift, 30 at most. Amortised on v5e:4x4's busiest owner
    # (3.1x the mean load): about 0.25 GFLOP per chip per step, at most 2.5 - 0.07 % and 0.7 %
    # of bn's step at the paper's batch (386 GFLOP per chip).
    # E1's plateau schedule scales the update after the optimizer, which a manifold step does
    # not allow: cosine.
    "radam": ("--config.model.weights=stiefel", "--config.schedule=cosine",
              "--config.optimizer.stiefel.name=radam",
              "--config.optimizer.stiefel.learning_rate=1e-3",
              "--config.optimizer.stiefel.manifold.name=Stiefel",
              "--config.optimizer.stiefel.manifold.retraction=cayley",
              "--config.optimizer.stiefel.manifold.cayley_iterations=2"),
    # The same with the QR retraction (CholeskyQR): its Gram matrix is a sum over row
    # blocks, so a kernel split by rows stays split through it (linalg._rows).
    "radam_qr": ("--config.model.weights=stiefel", "--config.schedule=cosine",
                 "--config.optimizer.stiefel.name=radam",
                 "--config.optimizer.stiefel.learning_rate=1e-3",
                 "--config.optimizer.stiefel.manifold.name=Stiefel",
                 "--config.optimizer.stiefel.manifold.retraction=qr"),
    "muon": ("--config.model.weights=stiefel", "--config.optimizer.stiefel.name=muon",
             "--config.optimizer.stiefel.learning_rate=0.02"),
}
"""Every conv kernel of E1's ResNet-50 on an orthogonalizing optimizer, the rest on the
flagfile's SGD-momentum: the model's ``weights="stiefel"`` and the Stiefel group, as a
flagfile would set them (``--config.model.weights=stiefel --config.optimizer.stiefel.…``)."""


@dataclasses.dataclass(frozen=True)
class OwnerPlan:
  """What the owner-sharded update (``config.mesh.shard_update``) plans for a job.

  Attributes:
    num_owners: devices that own matrices.
    state: optimizer-state bytes per chip, ``(sharded, replicated)``.
    orthogonal_state: the same for the owner-sharded transformations' matrices only.
    load_max_over_mean: the most loaded owner's modelled update cost
      (:func:`orthojax.optim.assign_owners`) over the mean.
  """

  num_owners: int
  state: tuple[int, int]
  orthogonal_state: tuple[int, int]
  load_max_over_mean: float


def _bytes_per_chip(abstract: Any, shardings: Any) -> int:
  sizes = jax.tree.map(lambda x, s: math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize,
                       abstract, shardings)
  return int(sum(jax.tree.leaves(sizes)))


def owner_plan(config: Config, topology: str, optimizer=None) -> OwnerPlan | None:
  """The owner-sharded update's plan for ``config`` on ``topology``'s chips, from the
  trainer's program with and without ``mesh.shard_update`` (no compile); None when
  nothing is owner-sharded."""
  devices = topology_lib.Topology.parse(topology, config.mesh.num_slices).devices()
  info = data_lib.dataset_info(config.data["name"], published=True, **config.options)
  state, nodes = [], []
  for shard in (True, False):
    program = build_program(config.replace(mesh={"shard_update": shard}), info, devices=devices,
                            num_processes=len({d.process_index for d in devices}),
                            optimizer=optimizer)
    abstract = jax.eval_shape(program.init).opt_state
    state.append(_bytes_per_chip(abstract, program.state_sharding.opt_state))
    if shard:
      is_node = lambda x: isinstance(x, oj.optim.ShardedUpdateState)
      nodes = [x for x in jax.tree.leaves(abstract, is_leaf=is_node) if is_node(x)]
  if not nodes:
    return None
  layouts = [node.layout for node in nodes]
  loads = [sum(per_owner) for per_owner in zip(*(layout.loads() for layout in layouts))]
  replicated = 0
  for layout in layouts:
    owned = {leaf.index for leaf in layout.leaves} | {s.index for s in layout.split}
    replicated += sum(math.prod(aval[0]) * jax.numpy.dtype(aval[1]).itemsize
                      for role, aval in zip(layout.roles, layout.state_avals) if role in owned)
  return OwnerPlan(num_owners=layouts[0].num_owners, state=(state[0], state[1]),
                   orthogonal_state=(sum(l.state_bytes_per_owner() for l in layouts), replicated),
                   load_max_over_mean=max(loads) * len(loads) / sum(loads))


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
  if config.model["name"] == "ResNet":   # the 7x7/2 stem: 64 kernels over 112² outputs
    side = info.input_shape[0] // 2
    return 2.0 * side * side * 7 * 7 * info.input_shape[-1] * 64
  return 2.0 * features * (config.model.get("width") or 100)


def analytic_train_flops(config, info) -> float:
  return 3 * forward_matmul_flops(config, info) - _first_layer_flops(config, info)


def _cases(quick: bool):
  e1 = lambda norm, *o: flagfile_config(f"e1_resnet50_{norm}.flags",
                                        "--config.compute_dtype=bfloat16", *o)
  # E5 as its experiment compiles it (--compile_for): the flagfile's float32, the
  # Euclidean network on Adam (its Euclidean group), the Stiefel one on radam.
  e5 = e5_config
  # The overhead targets, at 256 images per chip (the per-chip batch TPU recipes
  # use; global 4096 on 16 chips): the optimizer's work per chip does not shrink
  # with the batch, the network's does.
  big = ("--config.batch_size=4096", "--config.optimizer.euclidean.learning_rate=1.6")
  yield "E1 bn v5e:4x4 b4096", e1("bn", *big), "v5e:4x4", {}
  yield "E1 bn muon convs v5e:4x4 b4096", e1("bn", *big, *CONV_OPTIMIZERS["muon"]), "v5e:4x4", {}
  yield "E1 gmp_imn v5e:4x4 b4096", e1("gmp_imn", *big), "v5e:4x4", {}
  yield ("E1 bn radam-cayley convs v5e:4x4 b4096", e1("bn", *big, *CONV_OPTIMIZERS["radam"]),
         "v5e:4x4", {})
  if quick:
    return
  # The paper's global batch, 256: does it fit, and what does it cost per example.
  yield "E1 bn v5e:4x4", e1("bn"), "v5e:4x4", {}
  yield "E1 bn radam-cayley convs v5e:4x4", e1("bn", *CONV_OPTIMIZERS["radam"]), "v5e:4x4", {}
  yield "E1 bn muon convs v5e:4x4", e1("bn", *CONV_OPTIMIZERS["muon"]), "v5e:4x4", {}
  yield "E1 gmp_imn v5e:4x4", e1("gmp_imn"), "v5e:4x4", {}
  yield "E1 wn_mbn v5e:4x4", e1("wn_mbn"), "v5e:4x4", {}
  # E5's batch of 1000 and E2's eval batch of 1000 split over 8 chips, not 16; E5 at
  # twice the batch on twice the chips (the optimizer's share per chip halves).
  yield "E5 euclidean v5e:2x4", e5("euclidean"), "v5e:2x4", {}
  yield "E5 stiefel radam v5e:2x4", e5("stiefel"), "v5e:2x4", {}
  # LAPACK-style Householder QR in place of the default matrix-product QR (one CholeskyQR
  # pass).
  yield "E5 stiefel radam householder v5e:2x4", e5("stiefel", HOUSEHOLDER), "v5e:2x4", {}
  b2000 = ("--config.batch_size=2000", "--config.eval_batch_size=2000")
  yield "E5 euclidean v5e:4x4 b2000", e5("euclidean", *b2000), \
      "v5e:4x4", {}
  yield "E5 stiefel radam v5e:4x4 b2000", e5("stiefel", *b2000), \
      "v5e:4x4", {}
  yield "E2 vgg6 v5e:2x4", flagfile_config("e2_vgg6.flags", "--config.compute_dtype=bfloat16"), \
      "v5e:2x4", {}
  yield "E1 bn fsdp v5e:4x4", e1("bn", "--config.mesh.data=1", "--config.mesh.fsdp=-1"), \
      "v5e:4x4", {}
  yield "E1 bn 2 slices v5e:4x4", e1("bn"), "v5e:4x4", {"num_slices": 2}
  for topo in ("v5e:8x8", "v4:2x2x4"):
    for norm in ("bn", "gmp_imn", "wn_mbn"):
      yield f"E1 {norm} {topo}", e1(norm), topo, {}
  # The owner-sharded optimizers on a bigger pod and on GPUs: paper batch and 256 per chip.
  topologies = ["v5e:8x8"] + (["h100:1x1x8"] if _cuda_plugin() else [])
  for topo in topologies:
    per_256 = 256 * {"v5e:8x8": 64, "h100:1x1x8": 8}[topo]
    big = (f"--config.batch_size={per_256}", "--config.optimizer.euclidean.learning_rate=1.6")
    for kind in ("radam", "muon") + (("radam_qr",) if topo == "v5e:8x8" else ()):
      yield f"E1 bn {CONV_KINDS[kind]} convs {topo}", e1("bn", *CONV_OPTIMIZERS[kind]), topo, {}
    yield f"E1 bn {topo} b{per_256}", e1("bn", *big), topo, {}
    for kind in ("radam", "muon") + (("radam_qr",) if topo == "v5e:8x8" else ()):
      yield (f"E1 bn {CONV_KINDS[kind]} convs {topo} b{per_256}",
             e1("bn", *big, *CONV_OPTIMIZERS[kind]), topo, {})
  # The largest kernels split over all owners (mesh.split_above=1.0): the owner balance
  # against the p x p all-reduces inside their iterations.
  split = "--config.mesh.split_above=1.0"
  for topo in ["v5e:4x4"] + topologies:
    per_256 = 256 * {"v5e:4x4": 16, "v5e:8x8": 64, "h100:1x1x8": 8}[topo]
    big = (f"--config.batch_size={per_256}", "--config.optimizer.euclidean.learning_rate=1.6")
    for kind in ("radam", "muon") + (("radam_qr",) if topo == "v5e:8x8" else ()):
      yield (f"E1 bn {CONV_KINDS[kind]} convs {topo} split",
             e1("bn", *CONV_OPTIMIZERS[kind], split), topo, {})
      yield (f"E1 bn {CONV_KINDS[kind]} convs {topo} b{per_256} split",
             e1("bn", *big, *CONV_OPTIMIZERS[kind], split), topo, {})
  # The optimizer's cost per chip as the chip count grows (chips_table): 16 and 64 chips
  # above, 256 here, at the paper's batch (1 image per chip) and at 256 per chip.
  for batch in ((), ("--config.batch_size=65536", "--config.optimizer.euclidean.learning_rate=1.6")):
    tail = " b65536" if batch else ""
    yield f"E1 bn v5e:16x16{tail}", e1("bn", *batch), "v5e:16x16", {}
    for kind in ("radam", "muon"):
      yield (f"E1 bn {CONV_KINDS[kind]} convs v5e:16x16{tail}",
             e1("bn", *batch, *CONV_OPTIMIZERS[kind]), "v5e:16x16", {})
  if _cuda_plugin():   # the gpu-compile extra: deviceless H100 compiles
    yield "E1 bn h100:1x1x8", e1("bn"), "h100:1x1x8", {}
    yield "E1 gmp_imn h100:1x1x8", e1("gmp_imn"), "h100:1x1x8", {}
    yield "E5 euclidean h100:1x1x8", e5("euclidean"), "h100:1x1x8", {}
    yield "E5 stiefel radam h100:1x1x8", e5("stiefel"), "h100:1x1x8", {}
    yield "E5 stiefel radam householder h100:1x1x8", e5("stiefel", HOUSEHOLDER), \
        "h100:1x1x8", {}


def _cuda_plugin() -> bool:
  try:
    import jax_plugins.xla_cuda12  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


def run(quick: bool = False, on_report: Callable[[str, aot.CompileReport], None] | None = None,
        only: str | None = None) -> list[Row]:
  """Compile every case into rows. ``only``: comma-separated; a part that is a case's
  name selects that case, any other part every case whose name contains it; the cases
  run in the order of the first part that selects each."""
  rows = []
  for name, config, topo, how in selected(list(_cases(quick and not only)), only):
    if config.model.get("weights", "euclidean") != "euclidean":
      plan = owner_plan(config, topo)
      if plan is not None:
        PLANS[name] = plan
    report = aot.compile_for(config, topo, num_slices=how.get("num_slices"))
    REPORTS[name] = report
    if on_report:
      on_report(name, report)
    info = data_lib.dataset_info(config.data["name"], published=True, **config.options)
    gib = max(report.train.memory["total"], report.eval.memory["total"]) / 2 ** 30
    rows.append(row(SUITE, f"{name}: HBM per chip / capacity", gib / (report.chip.hbm_bytes / 2 ** 30),
                    "x", Target("<=", 1.0), note=f"{gib:.2f} GiB, batch {report.global_batch}"))
    rows.append(row(SUITE, f"{name}: GFLOP per example", report.flops_per_example / 1e9, "GFLOP",
                    note=f"roofline ≤ {report.examples_per_sec_per_chip_bound:.0f} ex/s/chip "
                         f"({report.bound_by}); compile {report.compile_seconds:.0f} s"))
    # Models without manifold weights: the network's FLOPs alone.
    if config.model.get("weights", "euclidean") == "euclidean":
      analytic = ANALYTIC[name] = analytic_train_flops(config, info)
      rows.append(row(SUITE, f"{name}: |FLOPs / analytic − 1|",
                      abs(report.flops_per_example / analytic - 1), "", WITHIN_5,
                      note=f"analytic {analytic / 1e9:.4g} GFLOP per example"))
  rows += _ratios()
  return rows


def selected(cases: list[tuple[Any, ...]], only: str | None) -> list[tuple[Any, ...]]:
  """The ``cases`` (name first) that ``only`` selects (all for None or ""): a part that
  is a case's name selects it, any other part every case whose name contains it; in the
  order of the first part that selects each."""
  parts = [part for part in (only or "").split(",") if part]
  if not parts:
    return cases
  names = {c[0] for c in cases}
  selects = lambda part, name: name == part if part in names else part in name
  first = {c[0]: min((k for k, part in enumerate(parts) if selects(part, c[0])), default=None)
           for c in cases}
  return sorted((c for c in cases if first[c[0]] is not None), key=lambda c: first[c[0]])


# (case, baseline, what the ratio is, FLOPs bound, bytes bound or None): each
# optimizer's compiled cost over its baseline's, at the paper's batch and at 256 per
# chip, and GmP's (gmp_imn) over batch norm's in E1's ResNet-50.
def _pairs() -> list[tuple[str, str, str, float, float | None]]:
  out = [("E1 gmp_imn v5e:4x4 b4096", "E1 bn v5e:4x4 b4096", "gmp_imn / bn (256 per chip)",
          1.05, 1.05)]
  for topo, big in (("v5e:4x4", "b4096"), ("v5e:8x8", "b16384"), ("h100:1x1x8", "b2048")):
    qr = (("radam-qr", 1.3, 1.05),) if topo == "v5e:8x8" else ()
    for kind, paper, per_256 in (("radam-cayley", 1.3, 1.05), *qr, ("muon", 1.15, 1.02)):
      for split in ("", " split"):
        out += [(f"E1 bn {kind} convs {topo}{split}", f"E1 bn {topo}",
                 f"{kind} on convs / bn, paper batch, {topo}{split}", paper, paper),
                (f"E1 bn {kind} convs {topo} {big}{split}", f"E1 bn {topo} {big}",
                 f"{kind} on convs / bn, 256 per chip, {topo}{split}", per_256, per_256)]
  # E5's row as docs/scale.md recorded it before the precision option and the padded
  # buckets (2.04x FLOPs, 1.99x bytes): --only E5 --strict guards it.
  out += [("E5 stiefel radam v5e:2x4", "E5 euclidean v5e:2x4",
           "E5 stiefel radam / euclidean, batch 1000, v5e:2x4", 2.04, 2.0),
          ("E5 stiefel radam v5e:4x4 b2000", "E5 euclidean v5e:4x4 b2000",
           "E5 stiefel radam / euclidean, batch 2000, v5e:4x4", 2.0, None),
          ("E5 stiefel radam h100:1x1x8", "E5 euclidean h100:1x1x8",
           "E5 stiefel radam / euclidean, batch 1000, h100:1x1x8", 2.5, 2.0)]
  for topo in ("v5e:2x4", "h100:1x1x8"):   # report-only: CholeskyQR against Householder
    out.append((f"E5 stiefel radam {topo}", f"E5 stiefel radam householder {topo}",
                f"E5 stiefel radam, CholeskyQR (default) / Householder QR, {topo}", None, None))
  return out


def _ratios() -> list[Row]:
  out = []
  for a, b, what_ratio, flops_bound, bytes_bound in _pairs():
    if a not in REPORTS or b not in REPORTS:
      continue
    ra, rb = REPORTS[a].train, REPORTS[b].train
    extra = (f"extra per chip per step: {(ra.flops - rb.flops) / 1e9:.4g} GFLOP, "
             f"{(ra.bytes_accessed - rb.bytes_accessed) / 2 ** 30:.3g} GiB of HBM traffic, "
             f"{(ra.memory['total'] - rb.memory['total']) / 2 ** 30:.3g} GiB of HBM")
    if a in PLANS:
      extra += f"; most loaded owner / mean: {PLANS[a].load_max_over_mean:.2f}"
    for what, x, y, bound in (("FLOPs", ra.flops, rb.flops, flops_bound),
                              ("bytes accessed", ra.bytes_accessed, rb.bytes_accessed,
                               bytes_bound)):
      out.append(row(SUITE, f"{what_ratio}, {what}", x / y, "x",
                     None if bound is None else Target("<=", bound), note=extra))
    if rb.matrix_unit_flops and ra.matrix_unit_flops > 1.0001 * ra.matmul_flops:
      # Reported: a float32 product at HIGHEST is six of a TPU's bfloat16 passes, the
      # network's DEFAULT one; the FLOPs row above counts each product once.
      out.append(row(SUITE, f"{what_ratio}, matrix-unit FLOPs (bfloat16 passes)",
                     ra.matrix_unit_flops / rb.matrix_unit_flops, "x",
                     note=f"products {ra.matrix_unit_flops / ra.matmul_flops:.2f} passes on "
                          f"average against {rb.matrix_unit_flops / rb.matmul_flops:.2f}"))
  for name, p in PLANS.items():
    mib = lambda b: f"{b / 2 ** 20:.1f} MiB"
    out.append(row(
        SUITE, f"{name}: orthogonal optimizer state per chip × {p.num_owners} / replicated",
        p.num_owners * p.orthogonal_state[0] / p.orthogonal_state[1], "x", Target("<=", 1.25),
        note=f"{mib(p.orthogonal_state[0])} per chip against {mib(p.orthogonal_state[1])}; "
             f"all optimizer state per chip {mib(p.state[0])} against {mib(p.state[1])} "
             f"replicated; most loaded owner / mean: {p.load_max_over_mean:.2f}"))
    if name in REPORTS:
      coll = REPORTS[name].train.optimizer_collectives
      maths = REPORTS[name].train.maths_collectives
      # A split matrix's p x p all-reduces run inside its iterations by design; the
      # owner-sharded update's sharing may be one all-reduce (orthojax.optim.plan).
      out.append(row(
          SUITE, f"{name}: all-reduces the optimizer's maths runs", maths.get(
              "all-reduce", {}).get("count", 0), "",
          None if name.endswith(" split") else Target("<=", 0),
          note="optimizer's collectives: " + (", ".join(
              f"{k} {int(v['count'])}× ({v['bytes'] / 2 ** 20:.0f} MiB)"
              for k, v in sorted(coll.items())) or "none")))
  if "E1 bn fsdp v5e:4x4" in REPORTS:
    fsdp, data = REPORTS["E1 bn fsdp v5e:4x4"].train, REPORTS["E1 bn v5e:4x4"].train
    out.append(row(SUITE, "E1 bn fsdp-16 / data-16, argument bytes per chip",
                   fsdp.memory["arguments"] / data.memory["arguments"], "x", Target("<=", 0.3),
                   note=f"all-gathers {int(fsdp.collectives.get('all-gather', {}).get('count', 0))}"))
  return out


CHIP_COUNTS = (("v5e:4x4", 16, "b4096"), ("v5e:8x8", 64, "b16384"), ("v5e:16x16", 256, "b65536"))


def chips_table(reports: dict[str, aot.CompileReport]) -> str:
  """E1's optimizer cost per chip and step against the chip count: each optimizer's
  compiled train step minus bn's (SGD) at the same batch, per chip, and as a share of
  bn's step, for the cases compiled (``--only "E1 bn"`` with the three topologies)."""
  head = ("| chips | batch per chip | optimizer | extra GFLOP per chip per step (share of bn's) "
          "| extra GiB of HBM traffic per chip per step (share) | optimizer's collectives |")
  lines = [head, "|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|"]
  for topo, chips, big in CHIP_COUNTS:
    for tail in ("", f" {big}"):
      base = reports.get(f"E1 bn {topo}{tail}")
      for kind in ("radam", "muon"):
        case = reports.get(f"E1 bn {CONV_KINDS[kind]} convs {topo}{tail}")
        if base is None or case is None:
          continue
        a, b = case.train, base.train
        coll = ", ".join(f"{k} {int(v['count'])}× ({v['bytes'] / 2 ** 20:.0f} MiB)"
                         for k, v in sorted(a.optimizer_collectives.items())) or "none"
        lines.append(
            f"| {chips} | {case.per_chip_batch:g} | {CONV_KINDS[kind]} | "
            f"{(a.flops - b.flops) / 1e9:.4g} ({a.flops / b.flops - 1:+.1%}) | "
            f"{(a.bytes_accessed - b.bytes_accessed) / 2 ** 30:.3g} "
            f"({a.bytes_accessed / b.bytes_accessed - 1:+.1%}) | {coll} |")
  return "\n".join(lines)


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
  parser.add_argument("--only", help="comma-separated: the case of that name, or the cases "
                      "whose names contain it")
  parser.add_argument("--report_dir", type=pathlib.Path,
                      help="also write each case's compile_report.json under this folder")
  parser.add_argument("--strict", action="store_true",
                      help="exit with status 1 if any target of the compiled cases is missed "
                           "(e.g. --only E5 --strict: E5's rows against docs/scale.md's)")
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
  if any(topo in name for name in REPORTS for topo, _, _ in CHIP_COUNTS):
    print("\n" + chips_table(REPORTS))
  missed = [r.case for r in rows if r.status == MISS]
  if missed:
    print(f"# {len(missed)} target(s) missed: " + "; ".join(missed))
  if args.strict and missed:
    raise SystemExit(1)


if __name__ == "__main__":
  main()
