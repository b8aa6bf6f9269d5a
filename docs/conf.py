"""Sphinx configuration of the orthojax documentation site.

Build it (from the repository root, after ``pip install -e ".[docs]"``)::

    sphinx-build -W --keep-going -b html docs docs/_build/html

``-W`` turns every warning into an error: a docstring that does not parse, a
cross-reference that does not resolve (``nitpicky``) or a page left out of the
table of contents fails the build, locally and in CI (``.ci/run``).

Toolchain (the one optax and flax use): autodoc + autosummary with napoleon
for the Google-style docstrings, MathJax for their ``.. math::`` formulas, and
MyST for the Markdown pages (the guides, and docs/results.md, performance.md,
scale.md, which stay where they are and are pages of the site as they are).

Examples. The code blocks of README.md and of the guides (docs/guides/*.md)
are *not* executed by Sphinx: they are executed by the test suite
(tests/docs/test_examples.py, part of the normal pytest run). Each Markdown
file's ```` ```python ```` blocks run in order in one namespace, in a temporary
directory; a ```` ```text ```` block right after a python block is the output
that block must print (compared like a doctest, with ``...`` as a wildcard).
Plain fenced blocks keep the README readable on GitHub and the guides readable
in the site. Mark a block that must not run (none do today) by writing
```` ```{code-block} python ```` in a guide instead.

Cross-references to other projects (jax, numpy, optax, flax, Python) would
come from intersphinx, but CI has no network beyond the package registries,
so their ``objects.inv`` inventories cannot be fetched: the names of those
projects' types are listed in ``nitpick_ignore_regex`` below instead, and
render as plain text. Only third-party and Python names are ignored there; an
unresolved ``orthojax`` name is always an error.
"""

from __future__ import annotations

import os
import pathlib
import sys

# This checkout's orthojax, even when another checkout is installed editable.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import orthojax  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

project = "orthojax"
author = "the orthojax authors"
copyright = "the orthojax authors"  # pylint: disable=redefined-builtin
release = orthojax.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "Thumbs.db", ".DS_Store"]

# -- autodoc / autosummary / napoleon ---------------------------------------
autosummary_generate = False       # the API pages list their entries by hand
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True   # show ``coeffs="quintic"``, not the evaluated object
autodoc_inherit_docstrings = True
autodoc_class_signature = "mixed"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True           # "Attributes:" of NamedTuples without duplicating fields
napoleon_attr_annotations = True

# Flax NNX modules and Variables are built through their metaclass's ``__call__(*args,
# **kwargs)``, which autodoc would show as every layer's signature; show
# ``__init__``'s instead, as for any class (Sphinx keeps this list privately,
# for ``enum``'s metaclass; the docs extra pins Sphinx to 9.0.x).
from sphinx.ext.autodoc._dynamic import _signatures  # noqa: E402  pylint: disable=g-import-not-at-top

_signatures._METACLASS_CALL_BLACKLIST = (  # pylint: disable=protected-access
    _signatures._METACLASS_CALL_BLACKLIST  # pylint: disable=protected-access
    | {"flax.nnx.pytreelib.PytreeMeta.__call__", "flax.nnx.variablelib.VariableMeta.__call__"})

# -- MyST ---------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# -- Cross-references ---------------------------------------------------------
nitpicky = True
_EXTERNAL = [
    # Python and its standard library.
    r"(int|float|complex|str|bytes|bool|object|type|dict|list|tuple|set|frozenset|"
    r"callable|Ellipsis|NoneType|function|module)",
    r"(typing|collections|collections\.abc|abc|types|enum|dataclasses|os|pathlib|inspect|"
    r"concurrent|threading|signal|json|numbers)\..*",
    r"(Any|Callable|Sequence|Mapping|MutableMapping|Iterable|Iterator|Hashable|Optional|"
    r"Union|Literal|NamedTuple|Protocol|TypeVar|Generator|Self|ClassVar|PathLike)",
    r"(ValueError|TypeError|RuntimeError|KeyError|IndexError|NotImplementedError|"
    r"FloatingPointError|AssertionError|Exception|OSError|FileNotFoundError|"
    r"SystemExit|KeyboardInterrupt|StopIteration)",
    # jax, numpy, optax, flax, orbax, etils, matplotlib, tensorflow.
    r"(jax|jaxlib|jnp|np|numpy|optax|flax|nnx|orbax|ocp|etils|epath|matplotlib|plt|"
    r"tensorflow|tf|tfds|ml_collections|absl|chex|jaxtyping)(\..*)?",
    r"(Array|ArrayLike|ndarray|DTypeLike|PyTree|Pytree|PRNGKey|KeyArray|Shape|Dtype|"
    r"Mesh|NamedSharding|PartitionSpec|GradientTransformation|"
    r"GradientTransformationExtraArgs|Params|Updates|OptState|Schedule|ScalarOrSchedule|"
    r"MuonDimensionNumbers|Module|Rngs|Variable|Param|State|GraphDef|Figure|Axes)",
]
# Parametrised builtins split at their commas by the annotation parser (tuple[float, ...]).
_EXTERNAL.append(r"(tuple|dict|list|Mapping)\[\w+")
# orthojax's own private type aliases, shown by name in a few signatures.
_EXTERNAL.append(r"(ArrayFn|Coeffs)")
# the trainer's internals that Loop's signature and docstring name (not in the API pages)
_EXTERNAL.append(r"orthojax\.train\.(program|inputs|workdir_lock)(\..*)?")
nitpick_ignore_regex = [(role, pattern) for role in ("py:class", "py:obj", "py:data",
                                                     "py:func", "py:mod", "py:exc")
                        for pattern in _EXTERNAL]

# -- HTML -----------------------------------------------------------------------
html_theme = "furo"
html_title = f"orthojax {release}"
html_static_path: list[str] = []


# -- References from orthojax's private modules ----------------------------------
# The library's public modules re-export names defined in private ones
# (``orthojax.linalg._cayley.cayley_transform`` is documented as
# ``orthojax.linalg.cayley_transform``), and a private module's overview
# docstring, shown on the API page of its public module, says
# :func:`cayley_transform`. Such a reference is resolved to the public name
# when one is documented; anything else stays unresolved and fails the build.
def _public_candidates(modname: str, target: str) -> list[str]:
  parts = modname.split(".") if modname else []
  candidates = []
  while parts:
    public = ".".join(p for p in parts if not p.startswith("_"))
    candidates.append(f"{public}.{target}")
    parts = parts[:-1]
  if target.startswith("orthojax."):
    mod, _, name = target.rpartition(".")
    candidates.append(".".join(p for p in mod.split(".") if not p.startswith("_")) + "." + name)
  return candidates


def _resolve_private_reference(app, env, node, contnode):
  if node.get("refdomain") != "py":
    return None
  domain = env.get_domain("py")
  target = node["reftarget"].lstrip("~.")
  for candidate in _public_candidates(node.get("py:module") or "", target):
    if candidate in domain.objects or candidate in domain.modules:
      return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], candidate,
                                 node, contnode)
  return None


def setup(app):
  app.connect("missing-reference", _resolve_private_reference)
