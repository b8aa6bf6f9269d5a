"""One registry of public constructors, and the resolver that builds them from config sections.

A *section* is a mapping with a ``name`` and that constructor's keyword
arguments, unchanged — the word in the config is the keyword the constructor
takes::

    {"name": "radam", "learning_rate": 1e-3,
     "manifold": {"name": "Stiefel", "retraction": "cayley", "cayley_iterations": 2}}
    # -> oj.optim.radam(learning_rate=1e-3,
    #                   manifold=oj.manifolds.Stiefel(retraction="cayley", cayley_iterations=2))

A keyword whose value is itself a section is built first, from the registry
that keyword names (``manifold`` → :data:`MANIFOLDS`, ``optimizer`` →
:data:`OPTIMIZERS`, ``layers`` → a list of :data:`LAYERS` sections). The
trainer supplies what only it knows (``rngs``, ``dtype``, the data's input and
output sizes, the scheduled ``learning_rate``, the model's matrix ``views``)
for the keywords the constructor takes and the section leaves out.

Every error is one line naming the config key: an unknown ``name``, a keyword
the constructor does not take, or the constructor's own ``ValueError`` /
``TypeError`` (``config.optimizer.stiefel.manifold.retraction='qrr': Stiefel: unknown
retraction='qrr'; choose one of ('qr', 'cayley', 'polar', 'newton_schulz')``).
This is the ml_collections / big_vision convention of configs that name
constructors, with one registry instead of string imports, so that a typo
is caught before anything is built and the list of choices can be printed.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping

import jax
import optax
from flax import nnx

from orthojax import manifolds
from orthojax import models
from orthojax import nn
from orthojax import optim
from orthojax.train.config import ConfigError


# lbfgs needs the loss value and function at every update, which a plain
# ``tx.update(grads, state, params)`` step does not pass.
_NOT_STEP_OPTIMIZERS = ("lbfgs",)


def _optax_aliases() -> dict[str, Callable[..., optax.GradientTransformation]]:
  """optax's optimizers, as ``optax.<name>``: its public functions whose first parameter
  is ``learning_rate``."""
  out = {}
  for name in dir(optax):
    fn = getattr(optax, name)
    if name.startswith("_") or name in _NOT_STEP_OPTIMIZERS or not inspect.isfunction(fn):
      continue
    params = list(inspect.signature(fn).parameters)
    if params and params[0] == "learning_rate":
      out[name] = fn
  return out


_OPTAX = _optax_aliases()
OPTIMIZERS: dict[str, Callable[..., Any]] = {
    **_OPTAX,
    **{f"optax.{name}": fn for name, fn in _OPTAX.items()},
    **{entry.name: entry.constructor for entry in optim.OPTIMIZER_TABLE},
}
"""Every optax optimizer (``sgd``, ``adam``, ``adamw``, ``lion`` …, also as
``optax.<name>``) and every orthojax one (:data:`orthojax.optim.OPTIMIZER_TABLE`), by the
name a section gives. Two names mean orthojax's: ``radam`` is
Riemannian Adam (Bécigneul & Ganea 2019) — optax's Rectified Adam is ``optax.radam`` —
and ``muon`` is orthojax's wrapper of optax.contrib's (same keywords, plus conv kernels
and stacks orthogonalized from their matrix view)."""

MANIFOLD_OPTIMIZERS = tuple(entry.name for entry in optim.OPTIMIZER_TABLE
                            if entry.keeps_manifold)
"""The optimizers that keep their parameters on a manifold (need manifold parameters):
the rows of :data:`orthojax.optim.OPTIMIZER_TABLE` that keep it."""

MANIFOLDS: dict[str, Callable[..., Any]] = {"Stiefel": manifolds.Stiefel,
                                            "Oblique": manifolds.Oblique}
"""The manifolds a ``manifold`` section names."""

MODELS: dict[str, Callable[..., Any]] = {
    **{name: getattr(models, name) for name in models.__all__ if name != "Unit"},
    "Sequential": nnx.Sequential}
"""Every :mod:`orthojax.models` class by its name, and ``Sequential`` (a list of
:data:`LAYERS` sections)."""

LAYERS: dict[str, Callable[..., Any]] = {
    "GmPDense": nn.GmPDense, "GmPConv": nn.GmPConv, "InputMeanNorm": nn.InputMeanNorm,
    "MeanOnlyBatchNorm": nn.MeanOnlyBatchNorm, "WeightNormDense": nn.WeightNormDense,
    "WeightNormConv": nn.WeightNormConv, "OrthogonalDense": nn.OrthogonalDense,
    "OrthogonalConv": nn.OrthogonalConv, "ManifoldLinear": nn.ManifoldLinear,
    "Unit": models.Unit, "Linear": nnx.Linear, "Conv": nnx.Conv, "BatchNorm": nnx.BatchNorm,
}
"""Layers of a ``Sequential`` model section; an activation is ``{"name": "tanh"}`` (any name
:func:`orthojax.nn.activation_fn` knows), and :data:`RESHAPES` are parameter-free steps."""

RESHAPES: dict[str, Callable[[jax.Array], jax.Array]] = {
    "flatten": lambda x: x.reshape(x.shape[0], -1),
    "global_average_pool": lambda x: x.mean(axis=tuple(range(1, x.ndim - 1))),
}
"""Parameter-free steps of a ``Sequential`` model: ``{"name": "flatten"}`` (to
``(batch, features)``) and ``{"name": "global_average_pool"}`` (mean over the spatial axes)."""

def _already_an_initializer(init: Callable[..., jax.Array]) -> Callable[[], Any]:
  def factory():
    return init
  factory.__name__ = init.__name__
  return factory


INITIALIZERS: dict[str, Callable[..., Any]] = {
    "orthogonal": nn.initializers.orthogonal,
    "delta_orthogonal": nn.initializers.delta_orthogonal,
    "gaussian": nn.initializers.gaussian,
    "variance_scaling": nn.initializers.variance_scaling,
    "zeros": _already_an_initializer(jax.nn.initializers.zeros),
    "ones": _already_an_initializer(jax.nn.initializers.ones),
    **{name: getattr(jax.nn.initializers, name) for name in (
        "constant", "normal", "truncated_normal", "uniform", "glorot_normal", "glorot_uniform",
        "he_normal", "he_uniform", "lecun_normal", "lecun_uniform")},
}
"""Initializers for ``kernel_init`` / ``bias_init`` / ``scale_init``: orthojax's (which read
the matrix view) and ``jax.nn.initializers``' (``{"name": "normal", "stddev": 0.01}``)."""

PENALTIES: dict[str, Callable[..., Any]] = {
    "add_orthogonality_penalty": optim.add_orthogonality_penalty}
"""The penalty section's constructor (its ``name`` may be left out)."""

REGISTRIES: dict[str, dict[str, Callable[..., Any]]] = {
    "model": MODELS, "layers": LAYERS, "optimizer": OPTIMIZERS,
    "manifold": MANIFOLDS, "penalty": PENALTIES, "kernel_init": INITIALIZERS,
    "bias_init": INITIALIZERS, "scale_init": INITIALIZERS}
"""Which registry a section (or a nested keyword) draws its ``name`` from."""

SUPPLIED_KEYWORDS = ("rngs", "dtype", "param_dtype", "in_features", "out_features",
                     "num_classes", "input_size", "vocab_size", "views", "mask", "kernel_metadata",
                     "bias_metadata")
"""The keywords that the trainer supplies from the data, the mesh or the model. The configs
and the command-line overrides never write them into a section, so the trainer's value is
used."""

DEFAULT_NAMES = {"penalty": "add_orthogonality_penalty"}
"""Sections with one constructor may leave ``name`` out."""


@dataclasses.dataclass(frozen=True)
class Supplied:
  """Values the trainer provides, used where the constructor takes the keyword and the
  section does not set it. ``owned`` ones may not be set by the section at all."""

  values: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  owned: tuple[str, ...] = ()


def keywords(fn: Callable[..., Any]) -> dict[str, inspect.Parameter]:
  """The parameters a section may set: ``fn``'s named parameters (a class: its
  ``__init__``'s), without ``self`` and ``*args`` / ``**kwargs``."""
  target = fn.__init__ if inspect.isclass(fn) else fn
  params = inspect.signature(target).parameters
  return {n: p for n, p in params.items()
          if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _takes_any_keyword(fn: Callable[..., Any]) -> bool:
  target = fn.__init__ if inspect.isclass(fn) else fn
  return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(target).parameters.values())


def _plain(section: Any) -> dict[str, Any]:
  """A ConfigDict / FrozenConfigDict / mapping as a plain dict (nested ones left as they are)."""
  if hasattr(section, "to_dict"):
    return dict(section.to_dict())
  return dict(section)


def _is_section(value: Any) -> bool:
  return (isinstance(value, Mapping) or hasattr(value, "to_dict")) and "name" in value


def _blame(key: str, section: Mapping[str, Any], error: Exception) -> str:
  """Name the one keyword of ``section`` that the constructor's message mentions, if any."""
  text = str(error).splitlines()[0] if str(error) else type(error).__name__
  def first_mention(k: str) -> int:
    spots = [text.find(form) for form in (f"{k}=", f"'{k}'", f"`{k}`", f" {k} ")]
    return min((i for i in spots if i >= 0), default=len(text))
  named = sorted((first_mention(k), k) for k in section if k != "name")
  if named and named[0][0] < len(text):
    k = named[0][1]
    return f"{key}.{k}={section[k]!r}: {text}"
  return f"{key}: {text}"


def resolve_name(kind: str, section: Mapping[str, Any], key: str) -> tuple[str, Callable[..., Any]]:
  """The constructor a section names, or a ConfigError listing the choices."""
  registry = REGISTRIES[kind]
  name = section.get("name", DEFAULT_NAMES.get(kind))
  if name is None:
    raise ConfigError(f"{key}.name: missing; choose one of {', '.join(sorted(registry))}")
  if name not in registry:
    raise ConfigError(f"{key}.name={name!r}: unknown; choose one of "
                      f"{', '.join(sorted(registry))}")
  return name, registry[name]


def build(kind: str, section: Mapping[str, Any], key: str | None = None,
          supplied: Supplied = Supplied(), *, check_only: bool = False) -> Any:
  """Build the object a section describes (see the module docstring).

  Args:
    kind: a key of :data:`REGISTRIES` (``"model"``, ``"optimizer"``, ``"manifold"`` …).
    section: ``name`` + the constructor's keyword arguments (nested sections allowed).
    key: the section's path for error messages (default ``config.<kind>``).
    supplied: what the trainer provides (see :class:`Supplied`).
    check_only: check names, keywords and required keywords (nested sections too)
      and return None — the config's up-front check. Cheap objects (manifolds,
      optimizers, initializers, the penalty link) are still constructed, so their
      own argument checks run; models and layers are not.

  Raises:
    ConfigError: one line naming the config key.
  """
  key = key or f"config.{kind}"
  section = _plain(section)
  name, fn = resolve_name(kind, section, key)
  if fn is nnx.Sequential:
    return _sequential(section, key, supplied, check_only)
  accepted = keywords(fn)
  kwargs = {}
  for k, value in section.items():
    if k == "name":
      continue
    if k in supplied.owned:
      raise ConfigError(f"{key}.{k}: set by the trainer (from the data, the mesh or the "
                        f"model), not in the config; remove it")
    if k not in accepted and not _takes_any_keyword(fn):
      raise ConfigError(f"{key}.{k}: {name} takes no keyword {k!r}; its keywords are "
                        f"{', '.join(n for n in accepted if n not in supplied.owned)}")
    kwargs[k] = _nested(k, value, f"{key}.{k}", check_only)
  for k, value in supplied.values.items():
    if k not in kwargs and k in accepted:
      kwargs[k] = value
  missing = [n for n, p in accepted.items() if p.default is p.empty and n not in kwargs]
  if missing:
    raise ConfigError(f"{key}.{missing[0]}: {name} needs it (no default)")
  if check_only and kind in ("model", "layers"):
    return None   # arrays: built by the trainer; everything else is cheap to build and check
  try:
    return fn(**kwargs)
  except (ValueError, TypeError) as e:
    raise ConfigError(_blame(key, section, e)) from e


def _nested(k: str, value: Any, key: str, check_only: bool) -> Any:
  """A keyword's value: a nested section is built from the registry its keyword names."""
  if k in REGISTRIES and _is_section(value):
    return build(k, value, key, Supplied(), check_only=check_only)
  if isinstance(value, Mapping) and not hasattr(value, "to_dict"):
    return value
  if hasattr(value, "to_dict"):
    return value.to_dict()
  return value


def _sequential(section: dict[str, Any], key: str, supplied: Supplied,
                check_only: bool = False) -> nnx.Module | None:
  """``{"name": "Sequential", "layers": [section, …]}``: layers and activations in order."""
  extra = sorted(set(section) - {"name", "layers"})
  if extra:
    raise ConfigError(f"{key}.{extra[0]}: Sequential takes only layers")
  layers = section.get("layers")
  if not layers:
    raise ConfigError(f"{key}.layers: a Sequential model needs a list of layer sections")
  built = []
  for i, layer in enumerate(layers):
    layer_key = f"{key}.layers[{i}]"
    if not _is_section(layer):
      raise ConfigError(f"{layer_key}: a section with a name, e.g. {{'name': 'OrthogonalDense', "
                        f"'in_features': 64, 'out_features': 64}} or {{'name': 'tanh'}}")
    if layer["name"] in RESHAPES:
      built.append(RESHAPES[layer["name"]])
      continue
    if layer["name"] not in LAYERS:
      try:
        fn = nn.activation_fn(layer["name"], "name")
      except ValueError:
        raise ConfigError(f"{layer_key}.name={layer['name']!r}: neither a layer "
                          f"({', '.join(sorted(LAYERS))}) nor an activation") from None
      if fn is not None:
        built.append(fn)
      continue
    layer_supplied = Supplied({k: v for k, v in supplied.values.items() if k in ("rngs", "dtype")},
                              owned=("rngs",))
    built.append(build("layers", layer, layer_key, layer_supplied, check_only=check_only))
  return None if check_only else nnx.Sequential(*built)


def with_defaults(kind: str, section: Mapping[str, Any] | None) -> Any:
  """``section`` with every keyword it leaves out at its constructor's (plain) default —
  so two sections that build the same object compare equal (resume checks)."""
  if not section:
    return section
  section = _plain(section)
  try:
    _, fn = resolve_name(kind, section, f"config.{kind}")
  except ConfigError:
    return section
  if fn is nnx.Sequential:
    return section
  out = {k: p.default for k, p in keywords(fn).items()
         if p.default is not p.empty and isinstance(p.default, (bool, int, float, str, type(None)))}
  for k, value in section.items():
    out[k] = with_defaults(k, value) if k in REGISTRIES and _is_section(value) else value
  return out


def describe(kind: str) -> str:
  """Every name of one registry with its keywords and defaults (for ``--config_help``)."""
  lines = []
  for name, fn in sorted(REGISTRIES[kind].items()):
    params = ", ".join(n if p.default is p.empty else f"{n}={p.default!r}"
                       for n, p in keywords(fn).items() if n != "rngs")
    lines.append(f"  {name}({params})")
  return "\n".join(lines)
