"""Every public name of the library has an entry in the API reference (docs/api/).

The API pages list their entries by hand (grouped, in reading order); this
test keeps them complete: a name added to a public module without an entry
fails here, before the docs build would silently leave it out. A re-export
(the same object under another module's name, e.g. ``orthojax.analysis.chi``
= ``orthojax.nn.initializers.chi``) counts as documented where its original is.
"""

from __future__ import annotations

import importlib
import pathlib
import re
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api"

MODULES = ["orthojax.linalg", "orthojax.manifolds", "orthojax.optim", "orthojax.penalties",
           "orthojax.nn", "orthojax.nn.initializers", "orthojax.nn.sharding", "orthojax.models",
           "orthojax.analysis", "orthojax.analysis.mean_field", "orthojax.train",
           "orthojax.compile"]

_DIRECTIVE = re.compile(
    r"^\.\. (?:auto(?:function|class|exception|data|attribute|module)|py:(?:data|function|class|"
    r"module|exception))::\s*(\S+)", re.M)
_CURRENT = re.compile(r"^\.\. (?:currentmodule|automodule|py:module)::\s*(\S+)", re.M)


def documented() -> set[str]:
  """Fully qualified names with an entry in docs/api/*.rst."""
  names = set()
  for page in API.glob("*.rst"):
    text = page.read_text()
    events = sorted([(m.start(), "mod", m.group(1)) for m in _CURRENT.finditer(text)]
                    + [(m.start(), "obj", m.group(1)) for m in _DIRECTIVE.finditer(text)])
    module = None
    for _, kind, name in events:
      if kind == "mod":
        module = name
        names.add(name)
      elif "." in name and name.startswith("orthojax"):
        names.add(name)
      else:
        names.add(f"{module}.{name}")
  return names


def public_names(module: types.ModuleType) -> list[str]:
  names = getattr(module, "__all__", None)
  if names is None:
    names = [n for n, v in vars(module).items()
             if not n.startswith("_") and not isinstance(v, types.ModuleType)
             and getattr(v, "__module__", module.__name__) != "typing"
             and n != "annotations"]
  return list(names)


def _resolve(qualname: str):
  module, _, name = qualname.rpartition(".")
  try:
    return getattr(importlib.import_module(module), name)
  except (ImportError, AttributeError):
    return importlib.import_module(qualname)


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_has_an_entry(module_name):
  docs = documented()
  objects = {}
  for qualname in docs:
    try:
      objects.setdefault(id(_resolve(qualname)), qualname)
    except Exception:  # pylint: disable=broad-except
      pass   # a page entry that is not importable fails the Sphinx build instead
  module = importlib.import_module(module_name)
  missing = []
  for name in public_names(module):
    value = getattr(module, name)
    qualname = f"{module_name}.{name}"
    if qualname in docs:
      continue
    if not isinstance(value, (str, int, float, bool)) and id(value) in objects:
      continue   # a re-export of a documented object
    if isinstance(value, types.ModuleType) and value.__name__ in docs:
      continue
    missing.append(qualname)
  assert not missing, (f"public names without an entry in docs/api/*.rst: {missing}; "
                       "add an auto* directive (or py:data for a constant) to the module's page")


def test_pages_are_in_the_reference_toctree():
  index = (API / "index.rst").read_text()
  for page in API.glob("*.rst"):
    if page.stem != "index":
      assert re.search(rf"^   {page.stem}$", index, re.M), page.name


def test_every_entry_resolves():
  for qualname in documented():
    _resolve(qualname)   # raises for an entry whose object was renamed or removed
