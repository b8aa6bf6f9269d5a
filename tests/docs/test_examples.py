"""Every python block of the README and of the documentation pages runs.

See ``markdown_examples.py`` for the rules (blocks of a page share one
namespace; a ``text`` block after a python block is its checked output).
"""

from __future__ import annotations

import os
import pathlib

import pytest

from tests.docs import markdown_examples

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md"] + [p for p in (ROOT / "docs").rglob("*.md")
                                        if "_build" not in p.parts])


def _has_python(path: pathlib.Path) -> bool:
  return any(b.info == "python" for b in markdown_examples.blocks(path.read_text()))


# One worker runs every page, in order: the pages' examples share its imports and the
# programs JAX has compiled for earlier pages (with -n, each worker would pay them again).
@pytest.mark.xdist_group("doc_pages")
@pytest.mark.parametrize("page", [p for p in PAGES if _has_python(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)   # examples write runs/ and plots where they stand
  monkeypatch.setenv("MPLBACKEND", "Agg")
  ran = markdown_examples.run(page.read_text(), str(page.relative_to(ROOT)))
  assert ran > 0


def test_output_blocks_are_parsed():
  text = "\n".join([
      "```python", "print(1 + 1)", "```", "", "```text", "2", "```",
      "```python", "x = 3", "```",
      "```bash", "echo no", "```",
      "```text", "not an output: a bash block stands between", "```"])
  got = [(b.info, b.line, b.code, b.output) for b in markdown_examples.blocks(text)]
  assert got == [("python", 2, "print(1 + 1)\n", "2\n"), ("python", 9, "x = 3\n", None),
                 ("bash", 12, "echo no\n", None),
                 ("text", 15, "not an output: a bash block stands between\n", None)]


def test_a_wrong_output_fails_with_the_line():
  text = "intro\n\n```python\nprint('a')\n```\n\n```text\nb\n```\n"
  with pytest.raises(markdown_examples.ExampleError, match=r"page.md:4: the printed output"):
    markdown_examples.run(text, "page.md")


def test_an_error_points_into_the_page():
  text = "```python\nx = 1\n```\n\n```python\n\n1 / 0\n```\n"
  with pytest.raises(markdown_examples.ExampleError, match=r"page.md:6") as e:
    markdown_examples.run(text, "page.md")
  assert 'File "page.md", line 7' in str(e.value)


def test_ellipsis_matches():
  assert markdown_examples.run("```python\nprint(0.123456)\n```\n```text\n0.12...\n```\n",
                               "p.md") == 1
