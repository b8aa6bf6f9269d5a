"""The pod compile check: compile a run for a TPU topology on a machine without it.

:func:`compile_for` builds the run's program with the trainer's own code
(``orthojax.train.program.build_program``) over abstract TPU devices
(:mod:`orthojax.compile.topology`), compiles its train and eval steps with
``libtpu`` (``orthojax.train.program.compile_program``) and reads the
executables:

* per-chip HBM from ``Compiled.memory_analysis()`` — arguments (params,
  optimizer state, batch), outputs, the bytes outputs alias from donated
  arguments, temporaries, generated code; the total is
  ``arguments + outputs − aliased + temporaries + code``;
* FLOPs and bytes accessed per chip from ``Compiled.cost_analysis()``, with
  loop bodies (scanned stacks, micro-batches) counted for every iteration
  (``orthojax.compile.hlo``);
* collectives by kind, with counts and bytes per step, from the optimized HLO;
* a roofline bound: step time ≥ max(FLOPs / peak FLOP/s, bytes / HBM
  bandwidth), hence examples/s per chip ≤ per-chip batch / that time. It is
  an upper bound on throughput, not a measurement: it ignores collectives'
  latency, the input pipeline and imperfect overlap.

A job that does not fit raises :class:`DoesNotFitError` with one line saying
what it needs, what the chip has, and what to change.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

import jax

from etils import epath

from orthojax.compile import hlo
from orthojax.compile import topology as topology_lib
from orthojax.train.config import Config
from orthojax.train.program import ModelFn
from orthojax.train.program import OptimizerArg
from orthojax.train.program import build_program
from orthojax.train.program import compile_program
from orthojax.train.program import dataset_info

REPORT = "compile_report.json"
GiB = topology_lib.GiB


class DoesNotFitError(RuntimeError):
  """The compiled step needs more HBM per chip than the chip has (a one-line message)."""


@dataclasses.dataclass(frozen=True)
class StepReport:
  """One compiled step, per chip.

  Attributes:
    flops: FLOPs per step per chip, loop bodies counted per iteration, cuDNN convolutions
      (custom calls on GPU) counted from their shapes, guarded conditionals at their
      cheapest branch (``guarded_flops``).
    xla_flops: ``cost_analysis()["flops"]`` as XLA counts it (loop bodies once).
    bytes_accessed: HBM bytes read and written per step per chip: XLA's count with
      loop bodies counted per iteration (``orthojax.compile.hlo.loop_corrected_bytes``),
      guarded conditionals at their cheapest branch.
    xla_bytes_accessed: ``cost_analysis()["bytes accessed"]`` (loop bodies once).
    memory: bytes per chip: ``arguments``, ``outputs``, ``aliased``,
      ``temporaries``, ``code`` and their ``total``.
    collectives: ``{kind: {"count", "bytes"}}`` per step.
    unknown_loops: loops whose trip count could not be read (counted once).
    traffic_by_scope: HBM bytes per step per chip by the name scope of the ops
      (``orthojax.compile.hlo.Module.traffic_by_scope``): ``loss_and_grad``,
      ``optimizer/<transformation>``, ``(compiler-inserted)``.
    optimizer_collectives: the collectives among those that the optimizer's ops
      run (its scope), e.g. the owner-sharded update's one all-gather (or all-reduce).
    maths_collectives: ``optimizer_collectives`` less the owner-sharded update's sharing
      of the finished updates (scope ``owner_sharded``): those the optimizer's maths
      runs, e.g. a row-split matrix's Gram all-reduces.
    guarded_flops: ``flops`` with every guarded ``lax.cond``
      (``orthojax.linalg.guarded_cond``) at its costliest branch, as XLA counts: a
      guard's fall-back included (CholeskyQR2's second pass and Householder QR, a
      periodic re-orthonormalisation). ``flops`` and ``bytes_accessed`` count the
      cheapest branch, the step when no guard fires
      (``orthojax.compile.hlo.Module.from_text``).
    guarded_bytes_accessed: ``bytes_accessed`` counted the same way.
    matrix_unit_flops: the matrix products' FLOPs (loop bodies per iteration, guards at
      their cheapest branch) weighted by the bfloat16 passes a TPU's matrix unit makes for
      each (``orthojax.compile.hlo.Module.matrix_unit_flops``: a float32 product at
      ``HIGHEST`` six, at ``HIGH`` three, at ``DEFAULT`` one); ``flops`` counts each
      product once, as XLA does.
    matmul_flops: the same products counted once each (``matrix_unit_flops`` over this is
      the passes' mean).
  """

  flops: float
  xla_flops: float
  bytes_accessed: float
  memory: dict[str, int]
  collectives: dict[str, dict[str, float]]
  unknown_loops: int
  traffic_by_scope: dict[str, float] = dataclasses.field(default_factory=dict)
  xla_bytes_accessed: float = 0.0
  optimizer_collectives: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
  maths_collectives: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
  guarded_flops: float = 0.0
  guarded_bytes_accessed: float = 0.0
  matmul_flops: float = 0.0
  matrix_unit_flops: float = 0.0

  @classmethod
  def of(cls, compiled: Any) -> "StepReport":
    cost = compiled.cost_analysis() or _hlo_cost_analysis(compiled)
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    module = hlo.Module.from_text(compiled.as_text())
    unguarded = module.with_branches("cheapest")
    stats = compiled.memory_analysis()
    memory = {"arguments": stats.argument_size_in_bytes, "outputs": stats.output_size_in_bytes,
              "aliased": stats.alias_size_in_bytes, "temporaries": stats.temp_size_in_bytes,
              "code": stats.generated_code_size_in_bytes}
    memory["total"] = (memory["arguments"] + memory["outputs"] - memory["aliased"]
                       + memory["temporaries"] + memory["code"])
    xla_flops = float(cost.get("flops", 0.0))
    xla_bytes = float(cost.get("bytes accessed", 0.0))
    # cuDNN convolutions (GPU) are custom calls XLA's count leaves out; 0 on TPU.
    flops = hlo.loop_corrected_flops(xla_flops, module, unguarded) + hlo.cudnn_conv_flops(unguarded)
    guarded = hlo.loop_corrected_flops(xla_flops, module) + hlo.cudnn_conv_flops(module)
    return cls(flops=flops, xla_flops=xla_flops,
               bytes_accessed=hlo.loop_corrected_bytes(xla_bytes, module, unguarded),
               xla_bytes_accessed=xla_bytes, memory=memory,
               collectives=unguarded.collectives(), unknown_loops=module.unknown_loops,
               traffic_by_scope=unguarded.traffic_by_scope(depth=3),
               optimizer_collectives=unguarded.collectives(scope="optimizer"),
               maths_collectives=unguarded.collectives(scope="optimizer",
                                                       excluding="owner_sharded"),
               guarded_flops=guarded,
               guarded_bytes_accessed=hlo.loop_corrected_bytes(xla_bytes, module),
               matmul_flops=unguarded.matmul_flops(),
               matrix_unit_flops=unguarded.matrix_unit_flops())


def _shares(traffic: dict[str, float], top: int = 5) -> str:
  """``optimizer/retract 41 %, loss_and_grad 38 %, …`` — the largest shares first."""
  total = sum(traffic.values())
  if not total:
    return "—"
  return ", ".join(f"{k} {v / total:.0%}" for k, v in list(traffic.items())[:top])


def _hlo_cost_analysis(compiled: Any) -> dict[str, float]:
  """XLA's HLO cost analysis of an executable whose client cannot run it.

  A compile-only GPU client answers ``cost_analysis()`` with UNIMPLEMENTED, so
  the optimized module is analysed through the CPU client instead. This uses
  jaxlib's ``hlo_module_cost_analysis``, a private binding (no public API does
  this in jax 0.10); on failure the FLOPs and bytes are reported as 0.
  """
  try:
    from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
    module = compiled.runtime_executable().hlo_modules()[0]
    return dict(_jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module))
  except Exception:  # pylint: disable=broad-except
    return {}


@dataclasses.dataclass(frozen=True)
class CompileReport:
  """What :func:`compile_for` found; ``to_json()`` is ``compile_report.json``."""

  topology: str
  num_slices: int
  chip: topology_lib.ChipSpec
  num_chips: int
  mesh: dict[str, int]
  global_batch: int
  grad_accum_steps: int
  compute_dtype: str
  compile_seconds: float
  train: StepReport
  eval: StepReport

  @property
  def per_chip_batch(self) -> float:
    return self.global_batch / self.num_chips

  @property
  def flops_per_example(self) -> float:
    """Training FLOPs per example, all chips together."""
    return self.train.flops * self.num_chips / self.global_batch

  @property
  def step_seconds_bound(self) -> float:
    """Roofline lower bound on the train step's time."""
    return max(self.train.flops / self.chip.peak_bf16_flops,
               self.train.bytes_accessed / self.chip.hbm_bandwidth)

  @property
  def bound_by(self) -> str:
    compute = self.train.flops / self.chip.peak_bf16_flops
    return "compute" if compute >= self.train.bytes_accessed / self.chip.hbm_bandwidth else "memory"

  @property
  def examples_per_sec_per_chip_bound(self) -> float:
    return self.per_chip_batch / self.step_seconds_bound

  @property
  def fits(self) -> bool:
    return max(self.train.memory["total"], self.eval.memory["total"]) <= self.chip.hbm_bytes

  def to_json(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out.update(per_chip_batch=self.per_chip_batch, flops_per_example=self.flops_per_example,
               step_seconds_bound=self.step_seconds_bound, bound_by=self.bound_by,
               examples_per_sec_per_chip_bound=self.examples_per_sec_per_chip_bound,
               fits=self.fits, hbm_capacity=self.chip.hbm_bytes)
    return out

  def table(self) -> str:
    """The report as an aligned two-column table."""
    t, chip = self.train, self.chip
    mem = lambda m: (f"{m['total'] / GiB:.2f} GiB (args {m['arguments'] / GiB:.2f}, temps "
                     f"{m['temporaries'] / GiB:.2f}, outs {m['outputs'] / GiB:.2f}, aliased "
                     f"{m['aliased'] / GiB:.2f}, code {m['code'] / GiB:.3f})")
    coll = lambda c: ", ".join(f"{k} {int(v['count'])}× {v['bytes'] / 2**20:.1f} MiB"
                               for k, v in sorted(c.items())) or "none"
    rows = [
        ("topology", f"{self.topology}" + (f" × {self.num_slices} slices" if self.num_slices > 1
                                           else "") + f" ({self.num_chips} {chip.name} chip"
                                           + ("s)" if self.num_chips > 1 else ")")),
        ("mesh", " × ".join(f"{k} {v}" for k, v in self.mesh.items())),
        ("batch", f"global {self.global_batch}, per chip {self.per_chip_batch:g}"
                  + (f", {self.grad_accum_steps} micro-batches" if self.grad_accum_steps > 1
                     else "") + f", compute {self.compute_dtype}"),
        ("HBM per chip (train)", mem(t.memory)),
        ("HBM per chip (eval)", mem(self.eval.memory)),
        ("HBM capacity", f"{chip.hbm_bytes / GiB:.0f} GiB: "
                         + ("fits" if self.fits else "DOES NOT FIT")),
        ("FLOPs per step per chip", f"{t.flops:.4g}"
                                    + (f" (XLA counts {t.xla_flops:.4g}: loop bodies once)"
                                       if abs(t.flops - t.xla_flops) > 1e-6 * t.flops else "")),
        ("FLOPs per example", f"{self.flops_per_example / 1e9:.4g} GFLOP"),
        *([("matrix-unit FLOPs per step", f"{t.matrix_unit_flops:.4g} (products weighted by "
                                          f"their bfloat16 passes: {t.matrix_unit_flops / mm:.2f}"
                                          f"× their count of {mm:.4g})")]
          if (mm := t.matmul_flops) and t.matrix_unit_flops > 1.0001 * mm else []),
        *([("with every guard's fall-back", f"{t.guarded_flops:.4g} FLOPs, "
                                          f"{t.guarded_bytes_accessed / GiB:.3g} GiB per step "
                                          f"per chip (XLA's rule: each cond's costliest branch)")]
          if t.guarded_flops > 1.0001 * t.flops
          or t.guarded_bytes_accessed > 1.0001 * t.bytes_accessed else []),
        ("bytes accessed per step per chip", f"{t.bytes_accessed / GiB:.3g} GiB"
                                             + (f" (XLA counts {t.xla_bytes_accessed / GiB:.3g} GiB:"
                                                f" loop bodies once)"
                                                if abs(t.bytes_accessed - t.xla_bytes_accessed)
                                                > 1e-3 * t.bytes_accessed else "")),
        ("collectives per step", coll(t.collectives)),
        ("of which the optimizer's", coll(t.optimizer_collectives)),
        ("HBM traffic by scope", _shares(t.traffic_by_scope)),
        ("roofline", f"step ≥ {1e3 * self.step_seconds_bound:.3g} ms ({self.bound_by}-bound: "
                     f"{chip.peak_bf16_flops / 1e12:g} TFLOP/s, {chip.hbm_bandwidth / 1e9:g} GB/s)"
                     f" → ≤ {self.examples_per_sec_per_chip_bound:.4g} examples/s per chip"),
        ("compile time", f"{self.compile_seconds:.1f} s (train + eval)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

  def check_fits(self, config: Config) -> None:
    """Raise :class:`DoesNotFitError` (one line) when the job exceeds the chip's HBM."""
    if self.fits:
      return
    need = max(self.train.memory["total"], self.eval.memory["total"])
    raise _does_not_fit(config, self.topology, self.chip, f"{need / GiB:.3g} GiB per chip",
                        state_gib=self.train.memory["arguments"] / GiB,
                        temporaries_gib=self.train.memory["temporaries"] / GiB,
                        fsdp=self.mesh.get("fsdp", 1), num_chips=self.num_chips)


def _does_not_fit(config: Config, topology: str, chip: topology_lib.ChipSpec, need: str, *,
                  state_gib: float | None, temporaries_gib: float | None, fsdp: int,
                  num_chips: int) -> DoesNotFitError:
  """The one-line error: what the step needs, what the chip has, what to change."""
  hints = []
  if fsdp < num_chips:
    hints.append(f"shard params and optimizer state with config.mesh.fsdp (now {fsdp}"
                 + (f"; arguments take {state_gib:.3g} GiB per chip" if state_gib else "") + ")")
  hints.append(f"a smaller per-chip batch than {config.batch_size / num_chips:g} "
               f"(config.batch_size)")
  hints.append(f"micro-batches (config.grad_accum_steps, now {config.grad_accum_steps}"
               + (f"; temporaries take {temporaries_gib:.3g} GiB" if temporaries_gib else "")
               + ")")
  return DoesNotFitError(f"--compile_for={topology}: the step needs {need} but a {chip.name} "
                         f"chip has {chip.hbm_bytes / GiB:.3g} GiB; try " + "; or ".join(hints))


def compile_for(config: Config, topology: str, *, num_slices: int | None = None,
                num_chips: int | None = None, model_fn: ModelFn | None = None,
                optimizer: OptimizerArg | None = None) -> CompileReport:
  """Compile the run of ``config`` for ``topology`` and report on it.

  Args:
    config: the run's config; its mesh axes are taken over the topology's
      chips (``config.mesh.num_slices`` from ``num_slices`` when given, else the config).
    topology: e.g. ``"v5e:4x4"`` (:class:`orthojax.compile.topology.Topology`).
    num_chips: use only the topology's first ``num_chips`` chips (a run that its
      experiment pins to fewer devices, e.g. tiny full-batch runs on one).
    model_fn, optimizer: as for :func:`orthojax.train.fit`; None: the zoo model
      and the optimizer that ``config`` names.

  Raises:
    TopologyError: an unknown topology or no libtpu.
    ConfigError: a mesh or batch that does not fit the topology's chips.
  """
  slices = config.mesh.num_slices if num_slices is None else num_slices
  target = topology_lib.Topology.parse(topology, slices)
  config = config.replace(mesh={"num_slices": slices})
  info = dataset_info(config, published=True)
  devices = target.devices()[:num_chips]
  program = build_program(config, info, devices=devices,
                          num_processes=len({d.process_index for d in devices}),
                          model_fn=model_fn, optimizer=optimizer)
  try:
    compiled = compile_program(program)
  except jax.errors.JaxRuntimeError as e:   # the TPU compiler's own out-of-memory verdict
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    sizes = re.findall(r"\(([\d.]+[KMGT]?)\)", str(e).splitlines()[0])
    need = f"{sizes[0]} of temporaries per chip" if sizes else "more HBM than the chip has"
    raise _does_not_fit(config, topology, target.chip, need, state_gib=None,
                        temporaries_gib=None, fsdp=program.mesh.shape["fsdp"],
                        num_chips=len(devices)) from None
  return CompileReport(
      topology=topology, num_slices=slices, chip=target.chip, num_chips=len(devices),
      mesh=dict(program.mesh.shape), global_batch=config.batch_size,
      grad_accum_steps=config.grad_accum_steps, compute_dtype=config.compute_dtype,
      compile_seconds=compiled.seconds, train=StepReport.of(compiled.train_step),
      eval=StepReport.of(compiled.eval_step))


def write_reports(workdir: str, reports: dict[str, CompileReport]) -> str:
  """Write ``{name: report}`` to ``<workdir>/compile_report.json``; returns the path."""
  path = epath.Path(workdir) / REPORT
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({name: r.to_json() for name, r in reports.items()}, indent=1))
  return os.fspath(path)
