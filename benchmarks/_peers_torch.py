"""The PyTorch side of the peers benchmark, in its own process (no jax here).

A line protocol on stdin/stdout, one JSON object per line:
``{"cmd": "setup", "id": …, "spec": {…}}`` builds a step and runs it 10 times, answering
``{"defect": ‖WᵀW − I‖_F}``; ``{"cmd": "time", "id": …}`` runs it once, answering
``{"seconds": …}`` measured here; ``{"cmd": "quit"}`` ends. Specs: ``{"case": "optimizer",
"kind": "radam_qr" | "rsgd_qr" | "radam_cayley", "shape": […], "lr": …}`` or ``{"case":
"train", "kind": "adam" | "radam_qr" | "radam_cayley" | "geotorch" | "torch_orthogonal",
"depth": …, "width": …, "batch": …, "lr": …}``.
"""

from __future__ import annotations

import json
import sys
import time

import geoopt
import geotorch
import torch

from benchmarks import _peers_data

_MANIFOLDS = {"radam_qr": geoopt.EuclideanStiefel, "rsgd_qr": geoopt.EuclideanStiefel,
              "radam_cayley": geoopt.CanonicalStiefel}


def _optimizer(kind: str, params, lr: float):
  if kind == "rsgd_qr":
    return geoopt.optim.RiemannianSGD(params, lr=lr, momentum=0.9)
  return geoopt.optim.RiemannianAdam(params, lr=lr)


def optimizer_step(spec):
  """geoopt's step alone on one batched ManifoldParameter, a gradient given."""
  w, g = _peers_data.optimizer_case(tuple(spec["shape"]))
  param = geoopt.ManifoldParameter(torch.tensor(w), manifold=_MANIFOLDS[spec["kind"]]())
  grad = torch.tensor(g)
  opt = _optimizer(spec["kind"], [param], spec["lr"])

  def run():
    param.grad = grad.clone()
    opt.step()
    return param.detach()

  return run


def train_step(spec):
  """Forward, backward and update of the tanh MLP (``_peers_data.mlp_case``)."""
  x, y, hidden, head = _peers_data.mlp_case(spec["depth"], spec["width"], spec["batch"])
  x, y, kind = torch.tensor(x), torch.tensor(y), spec["kind"]
  head_p = torch.nn.Parameter(torch.tensor(head))
  if kind in ("geotorch", "torch_orthogonal"):
    layers = torch.nn.ModuleList()
    for w in hidden:
      layer = torch.nn.Linear(w.shape[0], w.shape[1], bias=False)
      if kind == "geotorch":
        geotorch.orthogonal(layer, "weight")
      else:
        torch.nn.utils.parametrizations.orthogonal(layer, "weight")
      layers.append(layer)
    opt = torch.optim.Adam([*layers.parameters(), head_p], lr=spec["lr"])
    hidden_layers = lambda: list(layers)
    weights = lambda: torch.stack([layer.weight for layer in layers])
  else:
    manifold = _MANIFOLDS.get(kind)
    w = (torch.nn.Parameter(torch.tensor(hidden)) if manifold is None else
         geoopt.ManifoldParameter(torch.tensor(hidden), manifold=manifold()))
    opt = (torch.optim.Adam([w, head_p], lr=spec["lr"]) if manifold is None else
           geoopt.optim.RiemannianAdam([w, head_p], lr=spec["lr"]))
    # The stack unbound once a step: its backward stacks the layers' gradients once,
    # where indexing ``w[i]`` per layer scatters each into a zeroed copy of the stack
    # (adam's whole step 255 → 174 ms, geoopt's QR 453 → 355 ms on a 2-core Xeon).
    hidden_layers = lambda: [lambda h, w_i=w_i: h @ w_i for w_i in w.unbind(0)]
    weights = lambda: w
  loss_fn = torch.nn.CrossEntropyLoss()

  def run():
    opt.zero_grad()
    h = x
    for layer in hidden_layers():
      h = torch.tanh(layer(h))
    loss_fn(h @ head_p, y).backward()
    opt.step()
    with torch.no_grad():
      return weights().detach()

  return run


def main() -> None:
  threads = int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads()
  if threads != torch.get_num_threads():
    # Only when it changes something: with torch 2.13.0+cpu on a 2-core machine, calling
    # set_num_threads(2) when 2 is already the count breaks batched torch.linalg.solve
    # (bad LU pivots; MKL reports SLASWP's parameter 6), which geoopt's Cayley uses.
    torch.set_num_threads(threads)
  print(json.dumps({"threads": torch.get_num_threads(), "torch": torch.__version__,
                    "geoopt": geoopt.__version__}), flush=True)
  steps = {}
  for line in sys.stdin:
    msg = json.loads(line)
    if msg["cmd"] == "quit":
      return
    if msg["cmd"] == "setup":
      spec = msg["spec"]
      step = (optimizer_step if spec["case"] == "optimizer" else train_step)(spec)
      for _ in range(10):
        out = step()
      steps[msg["id"]] = step
      reply = {"defect": _peers_data.defect(out.numpy())}
    else:
      start = time.perf_counter()
      steps[msg["id"]]()
      reply = {"seconds": time.perf_counter() - start}
    print(json.dumps(reply), flush=True)


if __name__ == "__main__":
  main()
