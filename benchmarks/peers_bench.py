"""orthojax against the PyTorch peers on one CPU, at equal threads.

The peers: geoopt's Riemannian optimizers (Kochurov, Karimov & Kozlukov, "Geoopt:
Riemannian Optimization in PyTorch", 2020), geotorch's and torch's orthogonal
parametrizations (Lezcano-Casado 2019). Like is compared with like:

* **Riemannian Adam, QR**: ``oj.optim.radam`` on ``Stiefel("qr")`` with
  ``second_moment="matrix_sum"`` against ``geoopt.optim.RiemannianAdam`` on
  ``geoopt.EuclideanStiefel``: the same algorithm (one ``‖g‖²`` per matrix, the
  first moment transported by projection, the sign-fixed QR retraction);
* **Riemannian SGD + momentum 0.9, QR**: ``oj.optim.rsgd`` against
  ``geoopt.optim.RiemannianSGD``, same manifold;
* **Riemannian Adam, Cayley**: ``Stiefel("cayley", metric="canonical")`` against
  ``geoopt.CanonicalStiefel`` (canonical-metric gradient, Cayley retraction).

The QR cases time orthojax's QR retraction both ways: one CholeskyQR pass (matrix products,
the default) and Householder (``Stiefel(qr_algorithm="householder")``, LAPACK).

Cases: the optimizer step alone, a gradient given, on a stack of 32 matrices
(400 × 400, and 1024 × 256) held as one batched parameter in both frameworks; and a
whole training step (forward, backward, update) of a 32-layer, 400-wide tanh MLP at
batch 1000 with Stiefel hidden weights and cross entropy (orthojax's layers a
``lax.scan`` unrolled, the straight-line program torch's Python loop runs; the rolled
scan's step is reported beside it), beside each framework's
Euclidean Adam and, for torch, geotorch's and ``torch.nn.utils.parametrizations``'
orthogonal layers under Adam. orthojax's steps are jitted; torch runs eagerly, as its
users do. float32 throughout.

Threads: XLA's CPU client uses every core; torch is set to as many
(``torch.set_num_threads(os.cpu_count())``); jaxlib's LAPACK runs on
``OPENBLAS_NUM_THREADS`` (1 by default in ``python -m benchmarks``: see its module
docstring). torch runs in its own process (:mod:`benchmarks._peers_torch`; jaxlib's and
torch's LAPACK clash in one), timing its own steps while this one waits. The methods of
a case alternate call by call and the median is reported; the 1-minute load average is
in the table's header. Before timing, every Riemannian method takes 10 steps and must leave its
weights orthonormal (``‖WᵀW − I‖_F ≤ 1e-4``), else the case raises.

The split (no peer needed, so it runs without the ``peers`` extra too): orthojax's whole
training step beside its parts, each compiled on its own and timed interleaved — forward
and backward (``jax.grad``), the update given those gradients, the step — for Adam and
Riemannian Adam (QR); the step minus the two is what the compiled step spends between them
(copies, scheduling). Every row's note names the CPU model: the peers' ratios differ from
one CPU to another.

Targets (ahead of geoopt on the same CPU), CPU only: each optimizer step at
``≤ 0.8×`` geoopt's time for the same algorithm; the whole training step's Riemannian
overhead over its own Adam at or below geoopt's over torch's Adam; and the whole training
step itself, forward and backward included, no slower than geoopt's (``≤ 1×``: there
XLA:CPU's matrix products, slower than torch's on some CPUs, count against orthojax).

Needs the ``peers`` extra (``pip install -e ".[peers]"``; not installed by CI): without
it the suite reports one row saying it was skipped and why.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

import orthojax as oj
from benchmarks import _harness
from benchmarks import _peers_data
from benchmarks._harness import Row
from benchmarks._harness import Target
from benchmarks._harness import ratio
from benchmarks._harness import row

SUITE = "peers"
PEERS = ("torch", "geoopt", "geotorch")
AHEAD = Target("<=", 0.8, backends=("cpu",))
WHOLE_STEP_AHEAD = Target("<=", 1.0, backends=("cpu",))   # forward and backward included
LR = 1e-3
_STACK = oj.linalg.MatrixView.stacked()
_ORTHONORMAL = 1e-4   # the largest ‖WᵀW − I‖_F after 10 steps before a method is timed


def missing_peers() -> list[str]:
  """The peer packages that are not installed."""
  return [p for p in PEERS if importlib.util.find_spec(p) is None]


class _TorchWorker:
  """The torch side in its own process (:mod:`benchmarks._peers_torch`): jaxlib's and
  torch's LAPACK cannot share one (their symbols clash: a wrong pivot in torch's
  ``lu_solve``). Steps are timed inside the worker; the parent waits meanwhile."""

  def __init__(self, threads: int):
    self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks._peers_torch", str(threads)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    self.info = self._read()

  def _read(self) -> dict[str, Any]:
    while True:   # a library's own line on stdout (a blank one, a notice) is passed on
      line = self.proc.stdout.readline()
      if not line:
        raise RuntimeError(f"the torch worker stopped (exit status {self.proc.wait()})")
      if line.startswith("{"):
        return json.loads(line)
      if line.strip():
        print(f"# torch worker: {line.rstrip()}", file=sys.stderr)

  def ask(self, **msg) -> dict[str, Any]:
    self.proc.stdin.write(json.dumps(msg) + "\n")
    self.proc.stdin.flush()
    return self._read()

  def step(self, name: str, spec: dict[str, Any]) -> Callable[[], float]:
    """Set up ``spec`` (10 steps, checked orthonormal); returns a timed step."""
    found = self.ask(cmd="setup", id=name, spec=spec)["defect"]
    if spec["kind"] != "adam" and found > _ORTHONORMAL:
      raise AssertionError(f"torch {name}: ‖WᵀW − I‖_F = {found:.2g} after 10 steps")
    return lambda: self.ask(cmd="time", id=name)["seconds"]

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
      self.proc.stdin.close()
    self.proc.wait(timeout=60)


def _timed(run: Callable[[], Any]) -> Callable[[], float]:
  """A step that returns its own wall seconds."""
  def timed():
    start = time.perf_counter()
    run()
    return time.perf_counter() - start
  return timed


def _checked(name: str, run: Callable[[], Any], constrained: bool) -> Callable[[], float]:
  """10 steps of ``run``, its weights orthonormal after them, then ``run`` timed."""
  for _ in range(10):
    out = run()
  if constrained and _peers_data.defect(out) > _ORTHONORMAL:
    raise AssertionError(f"orthojax {name}: ‖WᵀW − I‖_F = {_peers_data.defect(out):.2g} "
                         f"after 10 steps")
  return _timed(run)


def _time_interleaved(fns: dict[str, Callable[[], float]], warmup: int, repeats: int
                      ) -> dict[str, float]:
  """Median seconds of each timed step, the steps alternating call by call."""
  for fn in fns.values():
    for _ in range(warmup):
      fn()
  times = {k: [] for k in fns}
  for _ in range(repeats):
    for k, fn in fns.items():
      times[k].append(fn())
  return {k: statistics.median(v) for k, v in times.items()}


# ------------------------------------------------------------- orthojax ---

def _orthojax_optimizer(kind: str, qr_algorithm: str | None = None
                        ) -> optax.GradientTransformation:
  """orthojax's optimizer of ``kind``; ``qr_algorithm`` is the QR retraction's (None:
  ``Stiefel``'s default)."""
  st = oj.manifolds.Stiefel
  qr = st("qr") if qr_algorithm is None else st("qr", qr_algorithm=qr_algorithm)
  if kind == "rsgd_qr":
    return oj.optim.rsgd(LR, qr, momentum=0.9, views=_STACK)
  manifold = qr if kind == "radam_qr" else st("cayley", metric="canonical")
  return oj.optim.radam(LR, manifold, second_moment="matrix_sum", views=_STACK)


def _orthojax_step(tx: optax.GradientTransformation, w, g) -> Callable[[], Any]:
  """A no-argument optimizer step on ``w`` (kept in a closure), gradient ``g``."""
  g = jnp.asarray(g)
  box = {"w": jnp.asarray(w)}
  box["state"] = tx.init(box["w"])

  @jax.jit
  def step(w, state):
    u, state = tx.update(g, state, w)
    return optax.apply_updates(w, u), state

  def run():
    box["w"], box["state"] = step(box["w"], box["state"])
    return jax.block_until_ready(box["w"])

  return run


def _mlp_problem(tx_hidden, x, y, hidden, head, unrolled: bool = True):
  """``(params, tx, loss)`` of the tanh MLP: ``tx_hidden`` on the stack, Adam on the head.

  ``unrolled``: the layers as one scan unrolled into straight-line code (the program
  torch's Python loop runs), else a rolled ``lax.scan`` (one loop body, a smaller
  program; on XLA:CPU its backward is the slower, by the residuals it stacks)."""
  params = {"hidden": jnp.asarray(hidden), "head": jnp.asarray(head)}
  tx = optax.partition({"hidden": tx_hidden, "head": optax.adam(LR)},
                       {"hidden": "hidden", "head": "head"})
  x, y = jnp.asarray(x), jnp.asarray(y)

  def loss(p):
    h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, p["hidden"],
                        unroll=unrolled)
    return optax.softmax_cross_entropy_with_integer_labels(h @ p["head"], y).mean()

  return params, tx, loss


def _orthojax_train_step(tx_hidden, x, y, hidden, head, unrolled: bool = True
                         ) -> Callable[[], Any]:
  params, tx, loss = _mlp_problem(tx_hidden, x, y, hidden, head, unrolled)

  @jax.jit
  def step(p, state):
    u, state = tx.update(jax.grad(loss)(p), state, p)
    return optax.apply_updates(p, u), state

  box = {"p": params, "state": tx.init(params)}

  def run():
    box["p"], box["state"] = step(box["p"], box["state"])
    return jax.block_until_ready(box["p"]["hidden"])

  return run


# ---------------------------------------------------------------- cases ---

KINDS = ("radam_qr", "rsgd_qr", "radam_cayley")


def _optimizer_rows(worker: _TorchWorker, quick: bool, reps: dict[str, int]) -> list[Row]:
  rows = []
  for shape in ([(8, 200, 200)] if quick else [(32, 400, 400), (32, 1024, 256)]):
    w, g = _peers_data.optimizer_case(shape)
    label = f"{shape[0]} x {shape[1]}x{shape[2]}"
    for kind in KINDS:
      steps = {"orthojax": _checked(kind, _orthojax_step(_orthojax_optimizer(kind), w, g),
                                    True)}
      if kind.endswith("_qr"):   # the same retraction by LAPACK's Householder QR
        steps["orthojax householder"] = _checked(kind, _orthojax_step(
            _orthojax_optimizer(kind, "householder"), w, g), True)
      steps["geoopt"] = worker.step(f"{kind} {label}", {"case": "optimizer", "kind": kind,
                                                        "shape": list(shape), "lr": LR})
      t = _time_interleaved(steps, **reps)
      for who, s in t.items():
        rows.append(row(SUITE, f"{kind} step, {label}, {who}", 1e3 * s, "ms"))
      for who in (w for w in t if w.startswith("orthojax")):
        rows.append(row(SUITE, f"{kind} step, {label}: {who} / geoopt",
                        ratio(t[who], t["geoopt"]), "x", AHEAD,
                        note="the same algorithm; calls alternate"))
  return rows


def _training_rows(worker: _TorchWorker, quick: bool, reps: dict[str, int]) -> list[Row]:
  depth, width, batch = (8, 128, 256) if quick else (32, 400, 1000)
  x, y, hidden, head = _peers_data.mlp_case(depth, width, batch)
  steps = {"orthojax adam": _checked("adam", _orthojax_train_step(optax.adam(LR), x, y,
                                                                  hidden, head), False)}
  for kind in ("radam_qr", "radam_cayley"):
    steps[f"orthojax {kind}"] = _checked(
        kind, _orthojax_train_step(_orthojax_optimizer(kind), x, y, hidden, head), True)
  steps["orthojax radam_qr householder"] = _checked("radam_qr", _orthojax_train_step(
      _orthojax_optimizer("radam_qr", "householder"), x, y, hidden, head), True)
  steps["orthojax radam_qr scanned"] = _checked("radam_qr", _orthojax_train_step(
      _orthojax_optimizer("radam_qr"), x, y, hidden, head, unrolled=False), True)
  for kind in ("adam", "radam_qr", "radam_cayley", "geotorch", "torch_orthogonal"):
    steps[f"torch {kind}"] = worker.step(f"train {kind}", {
        "case": "train", "kind": kind, "depth": depth, "width": width, "batch": batch,
        "lr": LR})
  t = _time_interleaved(steps, **reps)
  label = f"{depth}x{width} tanh MLP, batch {batch}"
  rows = [row(SUITE, f"train step, {label}, {name}", 1e3 * s, "ms") for name, s in t.items()]
  theirs = ratio(t["torch radam_qr"], t["torch adam"])
  for ours in ("radam_qr", "radam_qr householder"):
    rows.append(row(SUITE, f"train step, {label}: orthojax {ours} / orthojax adam",
                    ratio(t[f"orthojax {ours}"], t["orthojax adam"]), "x",
                    Target("<=", round(theirs, 3), backends=("cpu",)),
                    note=f"the bound: geoopt radam_qr / torch adam = {theirs:.2f}"))
  for kind in ("radam_qr", "radam_cayley"):
    rows.append(row(SUITE, f"train step, {label}: orthojax {kind} / geoopt",
                    ratio(t[f"orthojax {kind}"], t[f"torch {kind}"]), "x", WHOLE_STEP_AHEAD,
                    note="the whole step, forward and backward included; layers unrolled, "
                         "as torch's loop runs them"))
  rows.append(row(SUITE, f"train step, {label}: orthojax radam_qr scanned / geoopt",
                  ratio(t["orthojax radam_qr scanned"], t["torch radam_qr"]), "x",
                  note="the layers as a rolled lax.scan: reported"))
  return rows


def _split_parts(tx_hidden, x, y, hidden, head) -> dict[str, Callable[[], Any]]:
  """orthojax's whole training step and its parts, each its own compiled program on the
  same arrays: forward and backward (``jax.grad``; unrolled, and as a rolled scan), the
  update given those gradients, and the step; what the step costs beyond the unrolled
  forward and backward and the update is the copies and scheduling between them."""
  params, tx, loss = _mlp_problem(tx_hidden, x, y, hidden, head)
  _, _, scanned_loss = _mlp_problem(tx_hidden, x, y, hidden, head, unrolled=False)
  grad = jax.jit(jax.grad(loss))
  scanned_grad = jax.jit(jax.grad(scanned_loss))
  update = jax.jit(lambda g, state, p: optax.apply_updates(p, tx.update(g, state, p)[0]))
  step = jax.jit(lambda p, state: optax.apply_updates(p, tx.update(jax.grad(loss)(p), state,
                                                                   p)[0]))
  state = tx.init(params)
  g = grad(params)
  return {"forward+backward": lambda: jax.block_until_ready(grad(params)),
          "forward+backward, scanned": lambda: jax.block_until_ready(scanned_grad(params)),
          "update": lambda: jax.block_until_ready(update(g, state, params)),
          "step": lambda: jax.block_until_ready(step(params, state))}


def _split_rows(quick: bool, reps: dict[str, int]) -> list[Row]:
  """Where orthojax's whole CPU step goes (the peers' comparison needs no peer for it)."""
  depth, width, batch = (8, 128, 256) if quick else (32, 400, 1000)
  x, y, hidden, head = _peers_data.mlp_case(depth, width, batch)
  label = f"{depth}x{width} tanh MLP, batch {batch}"
  rows = []
  for kind in ("adam", "radam_qr"):
    tx = optax.adam(LR) if kind == "adam" else _orthojax_optimizer(kind)
    parts = _split_parts(tx, x, y, hidden, head)
    t = _time_interleaved({k: _timed(fn) for k, fn in parts.items()}, **reps)
    for part, seconds in t.items():
      rows.append(row(SUITE, f"train step split, {label}, orthojax {kind}: {part}",
                      1e3 * seconds, "ms"))
    rows.append(row(SUITE, f"train step split, {label}, orthojax {kind}: the rest",
                    1e3 * (t["step"] - t["forward+backward"] - t["update"]), "ms",
                    note="step − forward+backward − update: copies and scheduling"))
  return rows


def _with_cpu_model(rows: list[Row]) -> list[Row]:
  """Every row names the CPU it was measured on (the peers' ratios differ by machine)."""
  model = _harness.device_description()["cpu_model"]
  return [dataclasses.replace(r, note=f"{r.note}; {model}" if r.note else model)
          for r in rows]


def run(quick: bool = False) -> list[Row]:
  reps = dict(warmup=1, repeats=3) if quick else dict(warmup=2, repeats=7)
  missing = missing_peers()
  if missing:
    return _with_cpu_model(_split_rows(quick, reps) + [row(
        SUITE, "skipped", math.nan, "",
        note=f"{', '.join(missing)} not installed: pip install -e \".[peers]\"")])
  return _with_cpu_model(_split_rows(quick, reps) + _peer_rows(quick, reps))


def _peer_rows(quick: bool, reps: dict[str, int]) -> list[Row]:
  threads = os.cpu_count() or 1
  worker = _TorchWorker(threads)
  try:
    rows = [row(SUITE, "threads", threads, "",
                note=f"torch {worker.info['threads']} (torch {worker.info['torch']}, geoopt "
                     f"{worker.info['geoopt']}, its own process), XLA all {threads} cores, "
                     f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'default')}")]
    return rows + _optimizer_rows(worker, quick, reps) + _training_rows(worker, quick, reps)
  finally:
    worker.close()
