"""What a :func:`orthojax.train.fit` run trains, recorded so that a resume can check it.

A zoo run is described by its config's sections (names and keywords). A ``fit`` run gets
Python objects instead — a model factory and an optax transformation — so its record is
built from the objects themselves:

* the model: its class and every variable's path, type, dtype and shape, from the
  abstract model (``nnx.eval_shape``: no arrays);
* the optimizer: the *closure tree* of its ``update`` function. An optax transformation
  is a pair of closures; every hyperparameter it was built with (a learning rate, ``b1``,
  a schedule's boundaries, a partition's labels and inner transformations) is a value
  captured by those closures or by the functions they capture. :func:`describe_transform`
  walks them — functions by qualified name with their captured values, containers
  element by element, small arrays by shape, dtype and a SHA-256 of their bytes — and
  returns a JSON tree. Two transformations built by the same code with the same values
  have the same tree, in any process; a changed value shows up as the leaf that differs
  (``…update_fns.1.step_size=-0.05 (checkpoint: -0.01)``).

The walk stops at ``MAX_DEPTH`` levels and never uses ``repr`` of an object (which may hold a
memory address): an object it does not know is recorded by its type's name and its
attributes. A value captured only through a mutable object that changes later (a
``nonlocal`` counter) would be recorded as it is at the start of the run.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import types
from typing import Any

from flax import nnx
import jax
import numpy as np

FIT = "fit"   # ``model.name`` / ``data.name`` of a fit run's record
MAX_DEPTH = 24
_HASHED_ARRAY_SIZE = 1 << 20   # arrays up to this many elements are hashed; larger: shape
# Captured by owner-sharded updates: a resumed run may change its devices and mesh.
_RESUMABLE = (jax.sharding.Mesh, jax.sharding.AbstractMesh, jax.sharding.Sharding, jax.Device)


def describe_model(abstract: nnx.Module) -> dict[str, Any]:
  """``{"name": "fit", "class": …, "variables": {path: "Param float32[64, 32]"}}``."""
  variables = {}
  for path, variable in nnx.to_flat_state(nnx.state(abstract)):
    value = variable.get_value() if hasattr(variable, "get_value") else variable.value
    variables[".".join(map(str, path))] = (f"{type(variable).__name__} {value.dtype}"
                                           f"{list(value.shape)}")
  cls = type(abstract)
  return {"name": FIT, "class": f"{cls.__module__}.{cls.__qualname__}", "variables": variables}


def describe_transform(tx: Any) -> dict[str, Any]:
  """``{"update": the closure tree of tx.update}`` (the module docstring)."""
  return {"update": _describe(getattr(tx, "update", tx), 0, set())}


def _describe(obj: Any, depth: int, active: set[int]) -> Any:
  if obj is None or isinstance(obj, (bool, int, str)):
    return obj
  if isinstance(obj, float):
    return obj if np.isfinite(obj) else str(obj)
  if isinstance(obj, np.generic):
    return _describe(obj.item(), depth, active)
  if isinstance(obj, np.dtype):
    return str(obj)
  if isinstance(obj, enum.Enum):
    return f"{type(obj).__qualname__}.{obj.name}"
  if isinstance(obj, _RESUMABLE):   # where it runs, not what it computes
    return f"<{_name(type(obj))}>"
  if isinstance(obj, (np.ndarray, jax.Array, jax.ShapeDtypeStruct)):
    return _describe_array(obj)
  if depth >= MAX_DEPTH or id(obj) in active:
    return f"<{_name(type(obj))}>"
  active = active | {id(obj)}
  walk = lambda x: _describe(x, depth + 1, active)
  if isinstance(obj, types.ModuleType):
    return f"<module {obj.__name__}>"
  if isinstance(obj, functools.partial):
    return {"partial": walk(obj.func), "args": walk(obj.args), "keywords": walk(obj.keywords)}
  if isinstance(obj, types.MethodType):
    return {"method": _name(obj.__func__), "self": walk(obj.__self__)}
  if isinstance(obj, types.FunctionType):
    out = {"fn": _name(obj)}
    for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
      try:
        out[name] = walk(cell.cell_contents)
      except ValueError:   # an empty cell (a name bound after the function)
        out[name] = "<empty>"
    if obj.__defaults__:
      out["defaults"] = walk(obj.__defaults__)
    if obj.__kwdefaults__:
      out["kwdefaults"] = walk(obj.__kwdefaults__)
    return out
  if isinstance(obj, (types.BuiltinFunctionType, type)) or callable(obj) and hasattr(
      obj, "__qualname__") and not hasattr(obj, "__dict__"):
    return f"<{_name(obj)}>"
  if isinstance(obj, (nnx.Module, nnx.Variable)):
    return f"<{_name(type(obj))}>"
  if isinstance(obj, dict):
    return {str(k): walk(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
  if isinstance(obj, tuple) and hasattr(obj, "_fields"):   # a NamedTuple
    return {"type": _name(type(obj)), **{f: walk(getattr(obj, f)) for f in obj._fields}}
  if isinstance(obj, (list, tuple)):
    return {str(i): walk(v) for i, v in enumerate(obj)}
  if isinstance(obj, (set, frozenset)):
    return sorted(str(walk(v)) for v in obj)
  if dataclasses.is_dataclass(obj):
    return {"type": _name(type(obj)),
            **{f.name: walk(getattr(obj, f.name)) for f in dataclasses.fields(obj)}}
  leaves, treedef = jax.tree_util.tree_flatten(obj)
  if treedef.num_nodes > 1 or (leaves and leaves[0] is not obj):   # a registered pytree
    return {"type": _name(type(obj)), "leaves": walk(leaves)}
  if hasattr(obj, "__dict__"):
    return {"type": _name(type(obj)), **walk(vars(obj))}
  return f"<{_name(type(obj))}>"


def _describe_array(x: Any) -> str:
  shape, dtype = tuple(x.shape), np.dtype(x.dtype)
  text = f"{dtype}{list(shape)}"
  if (isinstance(x, jax.ShapeDtypeStruct) or dtype == object
      or int(np.prod(shape)) > _HASHED_ARRAY_SIZE):
    return text
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return text
  data = np.ascontiguousarray(np.asarray(x))
  return f"{text} sha256:{hashlib.sha256(data.tobytes()).hexdigest()[:16]}"


def _name(obj: Any) -> str:
  return f"{getattr(obj, '__module__', '') or ''}.{getattr(obj, '__qualname__', type(obj).__name__)}"
