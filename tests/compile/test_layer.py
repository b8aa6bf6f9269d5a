"""``orthojax.compile`` sits one floor above ``orthojax.train``: imports only point down.

Read from the source (no imports run): no module of the library outside the
package imports it, and the package imports neither the experiments nor the
benchmarks, which sit above it.
"""

from __future__ import annotations

import ast
import pathlib

LIBRARY = pathlib.Path(__file__).resolve().parents[2] / "orthojax"


def _imported(path: pathlib.Path) -> set[str]:
  """Every module name an ``import`` / ``from … import`` statement of ``path`` names."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names.add(node.module)
      names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return names


def test_nothing_below_imports_the_compile_package():
  upward = {str(path.relative_to(LIBRARY)): sorted(n for n in _imported(path)
                                                   if n.startswith("orthojax.compile"))
            for path in LIBRARY.rglob("*.py") if "compile" not in path.relative_to(LIBRARY).parts}
  assert not {k: v for k, v in upward.items() if v}


def test_the_compile_package_imports_nothing_above_it():
  above = ("experiments", "benchmarks", "tests", "launch")
  upward = {path.name: sorted(n for n in _imported(path) if n.split(".")[0] in above)
            for path in (LIBRARY / "compile").glob("*.py")}
  assert not {k: v for k, v in upward.items() if v}
  assert {"orthojax.train.program"} <= _imported(LIBRARY / "compile" / "aot.py")
