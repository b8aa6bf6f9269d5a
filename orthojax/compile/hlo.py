"""Reading a compiled executable's optimized HLO: collectives, loops, matmul FLOPs.

``Compiled.cost_analysis()`` counts every computation of the module once, so
the body of a ``while`` loop — a scanned layer stack, a scan over time,
micro-batches — is counted for one iteration, not for all of them. This
module parses the optimized HLO text (``Compiled.as_text()``) into its
computations, finds each loop's trip count from its condition
(``compare(i, constant(N)), direction=LT`` with ``i`` counting from 0, the
form ``lax.scan`` / ``fori_loop`` lower to), and weights every computation by
how often it runs. On that it counts

* collectives (all-reduce, all-gather, reduce-scatter, all-to-all,
  collective-permute; synchronous or ``-start`` async forms) with the bytes
  of their results, and
* the FLOPs of ``dot`` and ``convolution`` instructions, ``2 × output
  elements × contracted elements`` (per chip, as the module is per chip),

so that a loop body's share can be added back to XLA's own count
(:func:`loop_corrected_flops`). Elementwise work inside loop bodies stays
counted once; for the networks here it is well under 1 % of the matmul work.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import re
from typing import Any, Callable, Iterable

import numpy as np

from orthojax.linalg import GUARD_SCOPE

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_DTYPE_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
                "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
                "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.+?)\s+([\w\-]+)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_CALLEE = re.compile(r"\b(body|condition|calls|to_apply|true_computation|false_computation|"
                     r"branch_computations)=(\{[^}]*\}|%[\w.\-]+)")
_OPERAND = re.compile(r"%([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class Instruction:
  """One instruction of an HLO computation, its line ``%name = type op(rest`` split up."""

  name: str
  type: str        # the result type text, e.g. "f32[32,256]{1,0}" or a tuple
  op: str
  rest: str        # operands and attributes


def _arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
  """``(dtype, shape)`` of every array in a (possibly tuple) HLO type."""
  out = []
  for dtype, dims in _ARRAY.findall(type_text):
    if dtype in _DTYPE_BYTES:
      out.append((dtype, tuple(int(d) for d in dims.split(",") if d)))
  return out


def parse(hlo_text: str) -> tuple[dict[str, list[Instruction]], str]:
  """``({computation: instructions}, entry name)`` of an HLO module's text."""
  computations: dict[str, list[Instruction]] = {}
  entry, current = "", None
  for line in hlo_text.splitlines():
    if current is None:
      header = _HEADER.match(line)
      if header and not line.startswith("HloModule"):
        current = header.group(2)
        computations[current] = []
        if header.group(1):
          entry = current
      continue
    if line.startswith("}"):
      current = None
      continue
    match = _INSTRUCTION.match(line)
    if match:
      computations[current].append(Instruction(*match.groups()))
  return computations, entry


def _trip_count(loop: Instruction, computations: dict[str, list[Instruction]]) -> int | None:
  """How often a ``while`` runs its body: XLA's ``known_trip_count`` annotation where
  the backend writes one (CPU, GPU), else N of a condition ``i < N`` with ``i`` from 0
  (TPU), the compare on its own or wrapped in a fusion; None for any other form."""
  known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.rest)
  if known:
    return int(known.group(1))
  cond = re.search(r"condition=%?([\w.\-]+)", loop.rest)
  condition = computations.get(cond.group(1), []) if cond else []
  constants = {}
  for ins in condition:
    if ins.op == "constant":
      value = re.match(r"\s*(-?\d+)\)", ins.rest)
      if value:
        constants[ins.name] = int(value.group(1))

  def is_less_than(ins: Instruction) -> bool:
    if ins.op == "compare":
      return "direction=LT" in ins.rest
    callee = re.search(r"calls=%?([\w.\-]+)", ins.rest)
    body = computations.get(callee.group(1), []) if ins.op == "fusion" and callee else []
    return len(body) > 0 and body[-1].op == "compare" and "direction=LT" in body[-1].rest

  for ins in condition:
    operands = _OPERAND.findall(ins.rest.split(")")[0])
    if is_less_than(ins) and len(operands) == 2 and operands[1] in constants:
      return constants[operands[1]]
  return None


@dataclasses.dataclass(frozen=True)
class Module:
  """A parsed module with each computation's execution count per call of the entry."""

  computations: dict[str, list[Instruction]]
  entry: str
  runs: dict[str, int]           # computation -> times it runs per step
  unknown_loops: int             # loops whose trip count could not be read (counted once)

  @classmethod
  def from_text(cls, hlo_text: str, branches: str = "costliest") -> "Module":
    """Parse, and count how often each computation runs per step: a loop body its
    trip count times; of a ``conditional``'s branches only one.

    ``branches="costliest"`` (most matmul FLOPs, then most result bytes): each device
    runs one branch, and the per-chip numbers are the most loaded device's, as XLA's
    ``HloCostAnalysis`` takes each property's maximum over the branches.
    ``branches="cheapest"``: the step when no guard fires — a conditional in the
    :data:`orthojax.linalg.GUARD_SCOPE` scope (:func:`orthojax.linalg.guarded_cond`:
    :func:`orthojax.linalg.cholesky_qr2`'s second pass and Householder fall-back, a
    periodic ``reorthonormalize_every``) counts its cheapest branch; every other
    conditional (the owner-sharded update's ``lax.switch``) still its costliest."""
    computations, entry = parse(hlo_text)
    return cls._counted(computations, entry, branches)

  def with_branches(self, branches: str) -> "Module":
    """The same parsed module, its run counts read with ``branches`` (as in
    :meth:`from_text`)."""
    return self._counted(self.computations, self.entry, branches)

  @classmethod
  def _counted(cls, computations: dict[str, list[Instruction]], entry: str,
               branches: str) -> "Module":
    if branches not in ("costliest", "cheapest"):
      raise ValueError(f"branches must be 'costliest' or 'cheapest', got {branches!r}")
    def pick(ins: Instruction) -> Callable[..., str]:
      guarded = GUARD_SCOPE in _scope(ins.rest, 99).split("/")
      return min if branches == "cheapest" and guarded else max
    cost = functools.lru_cache(maxsize=None)(
        lambda name: _cost(name, computations, cost, pick))
    runs: dict[str, int] = collections.defaultdict(int)
    unknown = 0
    stack = [(entry, 1)]
    while stack:   # the call graph is a DAG; a callee reached twice adds up
      name, count = stack.pop()
      runs[name] += count
      for ins in computations.get(name, ()):
        trips = 1
        if ins.op == "while":
          found = _trip_count(ins, computations)
          trips = found if found is not None else 1
          unknown += found is None
        for kind, callees in _callees(ins, computations):
          if kind == "branch_computations":
            callees = [pick(ins)(callees, key=cost)]
          for callee in callees:
            stack.append((callee, count * (trips if kind == "body" else 1)))
    return cls(computations, entry, dict(runs), unknown)

  def instructions(self) -> Iterable[tuple[Instruction, int, dict[str, str]]]:
    """Every instruction with its computation's run count and that computation's types."""
    for name, body in self.computations.items():
      count = self.runs.get(name, 0)
      if count:
        types = {ins.name: ins.type for ins in body}
        for ins in body:
          yield ins, count, types

  def collectives(self, scope: str | None = None, *, excluding: str | None = None
                  ) -> dict[str, dict[str, float]]:
    """``{kind: {"count": executions per step, "bytes": result bytes per step}}``;
    with ``scope`` (e.g. ``"optimizer"``), only those whose ``op_name`` starts with it
    (an all-reduce the partitioner puts inside a retraction keeps the retraction's);
    with ``excluding`` (e.g. ``"owner_sharded"``), not those with a scope of that name."""
    out: dict[str, dict[str, float]] = {}
    for ins, count, _ in self.instructions():
      kind = ins.op[:-len("-start")] if ins.op.endswith("-start") else ins.op
      if kind not in COLLECTIVES:
        continue
      if not _in_scope(ins, scope):
        continue
      if excluding and excluding in _scope(ins.rest, 99).split("/"):
        continue
      entry = out.setdefault(kind, {"count": 0, "bytes": 0})
      entry["count"] += count
      entry["bytes"] += count * _result_bytes(ins)
    return out

  def matmul_flops(self, *, weighted: bool = True, scope: str | None = None) -> float:
    """FLOPs of every dot / convolution, each computation counted ``runs`` times
    (``weighted``) or once (as ``cost_analysis`` counts); with ``scope`` (e.g.
    ``"optimizer"``), only those whose ``op_name`` lies in it."""
    total = 0.0
    for ins, count, types in self.instructions():
      if ins.op in ("dot", "convolution") and _in_scope(ins, scope):
        total += _matmul_flops(ins, types) * (count if weighted else 1)
    return total


  def matrix_unit_flops(self, *, scope: str | None = None) -> float:
    """:meth:`matmul_flops` with each product weighted by the bfloat16 passes a TPU's
    matrix unit makes for it (:func:`bf16_passes`): a float32 product at ``HIGHEST``
    precision costs six, at ``HIGH`` (``BF16_BF16_F32_X3``) three, at the TPU's
    ``DEFAULT`` one, as does a bfloat16 product. XLA's count (and :meth:`matmul_flops`)
    charges each product once whatever its passes, which makes float32 maths look as
    cheap as the network's one-pass products."""
    total = 0.0
    for ins, count, types in self.instructions():
      if ins.op in ("dot", "convolution") and _in_scope(ins, scope):
        total += _matmul_flops(ins, types) * count * bf16_passes(ins, types)
    return total

  def traffic_by_scope(self, depth: int = 2, *, weighted: bool = True) -> dict[str, float]:
    """HBM bytes per step by the ``jax.named_scope`` the ops came from.

    Each top-level instruction (a fusion, a custom call, a copy, …; not the
    instructions inside a fusion, which stay on chip) reads its operands and
    writes its result: their bytes, times how often its computation runs, are
    charged to the first ``depth`` scopes of its ``op_name`` (``jit(…)``,
    ``jvp(…)`` / ``transpose(…)`` wrappers and loop segments removed; no
    ``op_name``: ``(compiler-inserted)``, e.g. copies and collectives) — the train step names
    ``loss_and_grad`` and ``optimizer``, orthojax's transformations their own
    (``optimizer/retract``, ``optimizer/scale_by_riemannian_adam``, …). This is
    XLA's own notion of "bytes accessed" per op, estimated from shapes (slices and
    in-place updates counted as XLA does, through nested fusions); with
    ``weighted=False`` (loop bodies once, as ``cost_analysis()`` counts them) the
    total is 10–30 % below XLA's on the steps here, so read the shares, not the
    absolute numbers.
    """
    out: dict[str, float] = collections.defaultdict(float)
    for body, count in self._top_level():
      count = count if weighted else 1
      types = {ins.name: ins.type for ins in body}
      for ins in body:
        if ins.op in _NO_TRAFFIC:
          continue
        out[_scope(ins.rest, depth)] += count * self._traffic(ins, types)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


  def kernels(self, scope: str | None = None) -> dict[str, int]:
    """Kernels launched per step, by kind: each top-level instruction that runs as a
    kernel (a fusion, a library call — gemm, Cholesky, triangular solve, a custom
    call —, a collective, a copy, an unfused op), times how often its computation
    runs (a loop body its trip count). Instructions inside a fusion are one kernel
    with it; control flow, tuples, parameters and bitcasts launch nothing. With
    ``scope`` (e.g. ``"optimizer"``), only those whose ``op_name`` lies in it.

    Kinds: ``"fusion"``, ``"gemm"`` (``dot`` or a cuBLAS custom call),
    ``"custom-call:<target>"``, else the op (``"cholesky"``, ``"copy"``, …). On a GPU
    each is one launch (at least); the count is what a step's fixed cost scales with.
    """
    out: dict[str, int] = collections.defaultdict(int)
    for body, count in self._top_level():
      for ins in body:
        if ins.op in _NO_TRAFFIC or ins.op.endswith("-done"):
          continue
        if not _in_scope(ins, scope):
          continue
        out[_kernel_kind(ins)] += count
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))

  def _top_level(self) -> Iterable[tuple[list[Instruction], int]]:
    """``(body, runs per step)`` of each computation that runs as its own kernels: not a
    fusion's body nor a reduction's ``to_apply`` (those run inside their caller's kernel)."""
    fused = set()
    for body in self.computations.values():
      for ins in body:
        for kind, callees in _CALLEE.findall(ins.rest):
          if ins.op == "fusion" or kind == "to_apply":
            fused.update(_OPERAND.findall(callees))
    for name, body in self.computations.items():
      count = self.runs.get(name, 0)
      if count and name not in fused:
        yield body, count

  def _traffic(self, ins: Instruction, types: dict[str, str]) -> int:
    """Bytes one top-level instruction reads and writes. Slices read only the slice
    and an in-place ``dynamic-update-slice`` writes only the update — inside a
    fusion too (also a multi-output one), where a parameter used only by slices
    counts as the slices (a scanned stack's layer, not the whole stack) and one
    only updated in place is not read."""
    operands = _OPERAND.findall(ins.rest.split("), ")[0])
    sizes = [_bytes(types.get(o, "")) for o in operands]
    if ins.op.endswith("-start"):
      return 0                             # an async pair is counted at its -done
    if ins.op.endswith("-done"):
      return 2 * _bytes(ins.type)          # read the source, write the result
    if ins.op in _SLICES:
      return 2 * _bytes(ins.type)
    if ins.op == "dynamic-update-slice":
      return 2 * sizes[1] if len(sizes) > 1 else _bytes(ins.type)
    callee = re.search(r"calls=%?([\w.\-]+)", ins.rest) if ins.op == "fusion" else None
    body = self.computations.get(callee.group(1), []) if callee else []
    if not body:
      return _bytes(ins.type) + sum(sizes)
    by_name = {i.name: i for i in body}
    users = _users(body)
    for i in body:
      if i.op == "parameter":
        k = re.match(r"\s*(\d+)\)", i.rest)
        partial = self._reads(i.name, users) if k else None
        if k and partial is not None and int(k.group(1)) < len(sizes):
          sizes[int(k.group(1))] = partial
    root = body[-1]
    outputs = [by_name.get(o) for o in _operands(root)] if root.op == "tuple" else [root]

    def written(out: Instruction | None) -> int:
      if out is not None and out.op == "dynamic-update-slice":
        update = _operands(out)[1:2]
        return _bytes(by_name[update[0]].type) if update and update[0] in by_name else 0
      return _bytes(out.type) if out is not None else 0

    return sum(written(o) for o in outputs) + sum(sizes)


  def _reads(self, name: str, users: dict[str, list[Instruction]]) -> int | None:
    """Bytes a fused value is read through slices, or None if some use reads it whole.
    In-place updates do not read their buffer; bitcasts and nested fusions are looked
    through."""
    total = 0
    for u in users.get(name, []):
      first = _operands(u)[:1] == [name]
      if u.op in _SLICES and first:
        total += _bytes(u.type)
        continue
      if u.op == "dynamic-update-slice" and first:
        continue                            # the buffer updated in place: not read
      if u.op == "bitcast":
        inner = self._reads(u.name, users)
      elif u.op == "fusion":                # a fusion nested in this one: look inside
        inner = self._param_reads(u, _operands(u).index(name))
      else:
        inner = None
      if inner is None:
        return None
      total += inner
    return total

  def _param_reads(self, fusion: Instruction, index: int) -> int | None:
    """:meth:`_reads` of the ``index``-th parameter of ``fusion``'s computation."""
    callee = re.search(r"calls=%?([\w.\-]+)", fusion.rest)
    body = self.computations.get(callee.group(1), []) if callee else []
    param = next((i for i in body if i.op == "parameter"
                  and re.match(rf"\s*{index}\)", i.rest)), None)
    return None if param is None else self._reads(param.name, _users(body))


def _callees(ins: Instruction, computations: dict[str, list[Instruction]]
             ) -> list[tuple[str, list[str]]]:
  """``[(kind, [computation, …])]`` that ``ins`` calls (``body``, ``calls``, …)."""
  return [(kind, [c for c in _OPERAND.findall(names) if c in computations])
          for kind, names in _CALLEE.findall(ins.rest)]


def _cost(name: str, computations: dict[str, list[Instruction]],
          cost: Callable[[str], tuple[float, int]],
          pick: Callable[[Instruction], Callable[..., str]] = lambda ins: max
          ) -> tuple[float, int]:
  """``(matmul FLOPs, result bytes)`` of one run of computation ``name`` and what it
  calls (loops by their trip count, a conditional by the branch ``pick(conditional)``
  chooses: ``max``, the costliest, or ``min``)."""
  body = computations.get(name, ())
  types = {ins.name: ins.type for ins in body}
  flops, size = 0.0, 0
  for ins in body:
    if ins.op in ("dot", "convolution"):
      flops += _matmul_flops(ins, types)
    size += _result_bytes(ins)
    trips = (_trip_count(ins, computations) or 1) if ins.op == "while" else 1
    for kind, callees in _callees(ins, computations):
      if not callees:
        continue
      parts = [pick(ins)(callees, key=cost)] if kind == "branch_computations" else callees
      for callee in parts:
        f, b = cost(callee)
        times = trips if kind == "body" else 1
        flops, size = flops + times * f, size + times * b
  return flops, size


def _users(body: list[Instruction]) -> dict[str, list[Instruction]]:
  """Each value of a computation → the instructions that take it as an operand."""
  users: dict[str, list[Instruction]] = collections.defaultdict(list)
  for ins in body:
    for o in _operands(ins):
      users[o].append(ins)
  return users


def _operands(ins: Instruction) -> list[str]:
  return _OPERAND.findall(ins.rest.split("), ")[0])


_SLICES = ("dynamic-slice", "slice", "gather")


_NO_TRAFFIC = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while",
               "conditional", "call", "after-all", "partition-id", "replica-id",
               "opt-barrier")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CONTROL = ("while", "body", "cond", "scan", "closed_call", "remat", "checkpoint", "cond_fun",
            "body_fun", "shard_map", "switch")
_BRANCH = re.compile(r"^branch_\d+(_fun)?$")   # lax.switch / lax.cond branches
_WRAPPER = re.compile(r"^\w+\((.*)\)$")


def _in_scope(ins: Instruction, scope: str | None) -> bool:
  """Whether ``ins``'s ``op_name`` lies in ``scope`` (None: every instruction)."""
  return scope is None or (_scope(ins.rest, 99) + "/").startswith(scope + "/")


def _scope(rest: str, depth: int) -> str:
  """The first ``depth`` name scopes of an instruction's ``op_name``, or ``(unnamed)``."""
  found = _OP_NAME.search(rest)
  if not found:
    return "(compiler-inserted)"
  parts = []
  for part in found.group(1).split("/")[:-1]:   # the last segment is the primitive
    while (inner := _WRAPPER.match(part)) and not part.startswith("jit("):
      part = inner.group(1)
    if (part and not part.startswith(("jit(", "pjit(")) and part not in _CONTROL
        and not _BRANCH.match(part)):
      parts.append(part)
  return "/".join(parts[:depth]) or "(unscoped)"


def _bytes(type_text: str) -> int:
  return sum(_DTYPE_BYTES[d] * math.prod(s) for d, s in _arrays(type_text))


def _result_bytes(ins: Instruction) -> int:
  """Bytes a collective delivers. An async ``-start`` returns ``(operands, results[,
  context])``: a nested tuple when it combines several arrays, else a flat one."""
  arrays = _arrays(ins.type)
  if ins.op.endswith("-start") and ins.type.startswith("(("):
    arrays = arrays[len(arrays) // 2:]
  elif ins.op.endswith("-start") and ins.type.startswith("(") and len(arrays) > 1:
    arrays = arrays[1:2]
  return sum(_DTYPE_BYTES[d] * math.prod(s) for d, s in arrays)


_ALGORITHM_PASSES = {"dot_bf16_bf16_f32": 1, "dot_bf16_bf16_f32_x3": 3,
                     "dot_bf16_bf16_f32_x6": 6, "dot_tf32_tf32_f32": 1,
                     "dot_tf32_tf32_f32_x3": 3}
_PRECISION_PASSES = {"default": 1, "high": 3, "highest": 6}


def bf16_passes(ins: Instruction, types: dict[str, str]) -> int:
  """The bfloat16 passes a TPU's matrix unit makes for the product ``ins``: its
  ``algorithm=`` if it names one, else its operands' ``operand_precision`` (``HIGHEST``
  six, ``HIGH`` three, ``DEFAULT`` one: the float32 emulations of Henry, Tang & Heinecke,
  "Leveraging the bfloat16 artificial intelligence datatype for higher-precision
  computations", ARITH 2019) for float32 operands; one pass for narrower ones."""
  algorithm = re.search(r"algorithm=(\w+)", ins.rest)
  if algorithm and algorithm.group(1) in _ALGORITHM_PASSES:
    return _ALGORITHM_PASSES[algorithm.group(1)]
  operands = _OPERAND.findall(ins.rest.split(")")[0])
  dtypes = {_arrays(types[o])[0][0] for o in operands[:2] if o in types and _arrays(types[o])}
  if not dtypes & {"f32", "f64"}:
    return 1
  precision = re.search(r"operand_precision=\{(\w+)", ins.rest)
  return _PRECISION_PASSES.get(precision.group(1) if precision else "default", 1)


def _matmul_flops(ins: Instruction, types: dict[str, str]) -> float:
  out = _arrays(ins.type)
  operands = _OPERAND.findall(ins.rest.split(")")[0])
  if not out or len(operands) < 2 or operands[1] not in types:
    return 0.0
  out_elements = math.prod(out[0][1])
  rhs = _arrays(types[operands[1]])
  if not rhs:
    return 0.0
  rhs_shape = rhs[0][1]
  if ins.op == "dot":
    dims = re.search(r"rhs_contracting_dims=\{([\d,]*)\}", ins.rest)
    contracted = math.prod(rhs_shape[int(d)] for d in dims.group(1).split(",") if d) if dims else 1
  else:
    return _convolution_flops(ins, types, operands, out[0][1], rhs_shape)
  return 2.0 * out_elements * contracted


def _convolution_flops(ins: Instruction, types: dict[str, str], operands: list[str],
                       out_shape: tuple[int, ...], rhs_shape: tuple[int, ...]) -> float:
  """``2 × batch × output features × input features per group × real taps``, where the
  real taps of each spatial axis are the (output position, window tap) pairs that land on
  an input element rather than on padding or a dilation hole.

  Counting ``out elements × window`` instead overcounts the convolutions XLA:TPU makes of
  batched dots (a window as long as the batch, padded by one less on each side: one real
  tap per output) and the input gradients of strided convolutions (``lhs_dilate``).
  """
  labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", ins.rest)
  lhs = _arrays(types.get(operands[0], ""))
  if not labels or not lhs or "o" not in labels.group(2) or "f" not in labels.group(3):
    return 0.0
  lhs_labels, rhs_labels, out_labels = labels.groups()
  lhs_shape = lhs[0][1]
  window = re.search(r"window=\{([^}]*)\}", ins.rest)
  attrs = dict(re.findall(r"(\w+)=([\w\-]+)", window.group(1))) if window else {}
  spatial = sorted(c for c in out_labels if c.isdigit())

  def per_axis(key: str, default: int) -> list[Any]:
    values = attrs.get(key, "").split("x") if key in attrs else []
    return values if len(values) == len(spatial) else [default] * len(spatial)

  taps = 1
  for d, size, stride, pad, lhs_dilate, rhs_dilate in zip(
      spatial, per_axis("size", 1), per_axis("stride", 1), per_axis("pad", "0_0"),
      per_axis("lhs_dilate", 1), per_axis("rhs_dilate", 1)):
    n = lhs_shape[lhs_labels.index(d)]
    o = out_shape[out_labels.index(d)]
    lo = int(str(pad).split("_")[0])
    ld, rd, s = int(lhs_dilate), int(rhs_dilate), int(stride)
    positions = np.arange(o)[:, None] * s + np.arange(int(size))[None, :] * rd - lo
    real = (positions >= 0) & (positions <= (n - 1) * ld) & (positions % ld == 0)
    taps *= int(real.sum())
  batch = out_shape[out_labels.index("b")] if "b" in out_labels else 1
  return (2.0 * batch * out_shape[out_labels.index("f")] * rhs_shape[rhs_labels.index("i")]
          * taps)


def _kernel_kind(ins: Instruction) -> str:
  target = _custom_call_target(ins)
  if ins.op == "dot" or (target and ("gemm" in target.lower() or "matmul" in target.lower())):
    return "gemm"
  if target:
    return f"custom-call:{target}"
  return ins.op[:-len("-start")] if ins.op.endswith("-start") else ins.op


def _custom_call_target(ins: Instruction) -> str | None:
  """A ``custom-call``'s target name (``lapack_sgeqrf_ffi``, …), else None."""
  found = re.search(r'custom_call_target="([^"]+)"', ins.rest) if ins.op == "custom-call" else None
  return found.group(1) if found else None


def lapack_qr_flops(module: Module) -> float:
  """FLOPs of the LAPACK QR custom calls XLA:CPU makes (``jnp.linalg.qr``), which its
  cost analysis does not count: Householder ``geqrf`` of an m × n matrix (m ≥ n) costs
  2mn² − 2n³/3, forming Q with ``orgqr`` the same again (Golub & Van Loan, *Matrix
  Computations*, 4th ed., §5.2.2)."""
  total = 0.0
  for ins, count, _ in module.instructions():
    target = _custom_call_target(ins)
    if target and re.search(r"geqrf|orgqr|ungqr", target):
      *batch, m, n = _arrays(ins.type)[0][1]
      m, n = max(m, n), min(m, n)
      total += count * math.prod(batch) * (2 * m * n * n - 2 * n ** 3 / 3)
  return total


def lapack_flops(module: Module) -> float:
  """:func:`lapack_qr_flops` plus the Cholesky (``potrf``, n³/3 for n × n) and
  triangular-solve (``trsm``, m n² for an m × n right-hand side and an n × n triangle)
  custom calls — CholeskyQR2's (Golub & Van Loan, §4.2.7 and §3.1). Each counted as
  often as its computation runs in ``module`` (read it with ``branches="cheapest"`` to
  leave out a guard's fall-back)."""
  total = lapack_qr_flops(module)
  for ins, count, types in module.instructions():
    target = _custom_call_target(ins)
    if not target:
      continue
    if "potrf" in target:
      *batch, n, _ = _arrays(ins.type)[0][1]
      total += count * math.prod(batch) * n ** 3 / 3
    elif "trsm" in target:   # the triangle, the first operand: n × n (right side) or m × m
      *batch, m, n = _arrays(ins.type)[0][1]
      triangle = _arrays(types[_operands(ins)[0]])[0][1][-1]
      total += count * math.prod(batch) * m * n * triangle
  return total


_CUDNN_CONV = re.compile(r"cudnn\$conv(?:BiasActivation)?(Forward|BackwardInput|BackwardFilter)")


def cudnn_conv_flops(module: Module) -> float:
  """FLOPs of the cuDNN convolution custom calls XLA:GPU makes, which its cost analysis
  does not count: each is the forward convolution's ``2 × output elements × kernel
  elements per output feature`` (dim_labels say which axis is the output feature),
  read from the operands it has — the forward output is the result (forward), the
  first operand (input gradient) or the second (filter gradient)."""
  total = 0.0
  for ins, count, types in module.instructions():
    target = _custom_call_target(ins)
    kind = _CUDNN_CONV.search(target) if target else None
    labels = re.search(r"dim_labels=\w+_(\w+)->", ins.rest)
    if not kind or not labels or "o" not in labels.group(1):
      continue
    operands = [(_arrays(types.get(o, "")) or [(None, ())])[0][1] for o in _operands(ins)]
    result = (_arrays(ins.type) or [(None, ())])[0][1]
    if len(operands) < 2:
      continue
    out, kernel = {"Forward": (result, operands[1]), "BackwardInput": (operands[0], operands[1]),
                   "BackwardFilter": (operands[1], result)}[kind.group(1)]
    if not out or not kernel:
      continue
    per_feature = math.prod(kernel) // kernel[labels.group(1).index("o")]
    total += count * 2.0 * math.prod(out) * per_feature
  return total


def loop_corrected_flops(xla_flops: float, module: Module, counted: Module | None = None
                         ) -> float:
  """XLA's FLOP count with every loop body's matmul FLOPs counted ``trip count`` times.

  ``counted``: the same program read with ``branches="cheapest"``, to count its
  conditionals' cheapest branches in place of the costliest that XLA counts (``module``
  must then be the costliest reading, XLA's)."""
  counted = counted or module
  return xla_flops + counted.matmul_flops(weighted=True) - module.matmul_flops(weighted=False)


def loop_corrected_bytes(xla_bytes: float, module: Module, counted: Module | None = None
                         ) -> float:
  """XLA's HBM byte count with every loop body's traffic counted ``trip count`` times
  (``cost_analysis()`` counts a scanned stack's body once, like its FLOPs); ``counted``
  as in :func:`loop_corrected_flops`."""
  counted = counted or module
  weighted = sum(counted.traffic_by_scope(1).values())
  once = sum(module.traffic_by_scope(1, weighted=False).values())
  return xla_bytes + weighted - once
