"""How ``orthojax.optim`` is put together, read from the source (no imports run).

* Nothing ambient: no context variable anywhere in the library, no decorator on an
  optimizer constructor; views and buckets travel as arguments or in the state.
* The execution package (``orthojax.optim.execution``: owner sharding) sits above the
  algorithms: it imports them, they never import it.
* No function of ``orthojax.optim`` is longer than 80 lines, its docstring excluded.
"""

from __future__ import annotations

import ast
import pathlib

LIBRARY = pathlib.Path(__file__).resolve().parents[2] / "orthojax"
OPTIM = LIBRARY / "optim"
EXECUTION = OPTIM / "execution"


def _tree(path: pathlib.Path) -> ast.Module:
  return ast.parse(path.read_text(), str(path))


def _imported(path: pathlib.Path) -> set[str]:
  """Every module name an ``import`` / ``from … import`` statement of ``path`` names
  (relative imports resolved against the ``orthojax.optim`` package they sit in)."""
  package = ".".join(path.relative_to(LIBRARY.parent).with_suffix("").parts[:-1])
  names = set()
  for node in ast.walk(_tree(path)):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = package.rsplit(".", node.level - 1)[0] if node.level else ""
      module = ".".join(p for p in (base, node.module or "") if p)
      names.add(module)
      names.update(f"{module}.{alias.name}" for alias in node.names)
  return names


def test_no_context_variable_in_the_library():
  found = {str(path.relative_to(LIBRARY)) for path in LIBRARY.rglob("*.py")
           if {"contextvars"} & {n.split(".")[0] for n in _imported(path)}
           or "ContextVar" in path.read_text()}
  assert not found


def test_no_decorator_on_an_optimizer_constructor():
  """Every module-level function of ``orthojax.optim`` is a plain ``def``: a constructor
  returns its transformation, nothing wraps it on the way out."""
  decorated = [f"{path.name}:{node.name}" for path in OPTIM.rglob("*.py")
               for node in _tree(path).body
               if isinstance(node, ast.FunctionDef) and node.decorator_list]
  assert not decorated


def test_the_algorithms_do_not_import_the_execution_package():
  algorithms = [p for p in OPTIM.glob("*.py")]
  assert len(algorithms) > 10
  upward = {p.name: sorted(n for n in _imported(p) if n.startswith("orthojax.optim.execution"))
            for p in algorithms if p.name != "__init__.py"}
  assert not {k: v for k, v in upward.items() if v}
  # ... and the execution package does import them (shard_update follows their views).
  assert any(n.startswith("orthojax.optim._") for p in EXECUTION.glob("*.py")
             for n in _imported(p))


def _length(node: ast.FunctionDef) -> int:
  """The lines of ``node``, its docstring excluded."""
  lines = node.end_lineno - node.lineno + 1
  first = node.body[0]
  if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
      and isinstance(first.value.value, str)):
    lines -= first.end_lineno - first.lineno + 1
  return lines


def test_no_function_in_optim_is_longer_than_80_lines():
  long = {f"{path.relative_to(OPTIM)}:{node.name}": _length(node)
          for path in OPTIM.rglob("*.py") for node in ast.walk(_tree(path))
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _length(node) > 80}
  assert not long
