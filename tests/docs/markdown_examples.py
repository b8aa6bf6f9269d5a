"""Run the code blocks of Markdown pages: the README and the documentation.

The one mechanism by which every example of the README and of the guides is
executed (docs/conf.py says so too):

* every fenced block whose info string is exactly ``python`` runs, in the
  order of the page, in one namespace per page (a later block sees the names
  an earlier one defined), in a temporary working directory;
* a fenced ``text`` block that follows a python block (blank lines between
  allowed) is the output that block must print: compared as a doctest would
  (``doctest.ELLIPSIS`` — ``...`` matches anything — and
  ``NORMALIZE_WHITESPACE``);
* other blocks (``bash``, ``text`` that follows no python block, MyST
  directives such as ``{code-block} python``) are not run.

A failure names the page and the Markdown line: the code is compiled with its
own line numbers, so a traceback points into the ``.md`` file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import doctest
import io
import re
import traceback

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_CHECKER = doctest.OutputChecker()
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclasses.dataclass
class Block:
  info: str       # the fence's info string, e.g. "python"
  line: int       # 1-based line of the first code line
  code: str
  output: str | None = None   # the expected output, for a python block


def blocks(text: str) -> list[Block]:
  """The fenced blocks of a Markdown text; expected outputs attached to python blocks."""
  lines = text.splitlines()
  found: list[Block] = []
  i = 0
  last_end = {}   # index in ``found`` -> line index after its closing fence
  while i < len(lines):
    m = _FENCE.match(lines[i])
    if not m:
      i += 1
      continue
    fence, info, indent = m["fence"], m["info"].strip(), len(m["indent"])
    body, j = [], i + 1
    while j < len(lines) and not (lines[j].strip().startswith(fence)
                                  and set(lines[j].strip()) == {fence[0]}
                                  and len(lines[j].strip()) >= len(fence)):
      body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
      j += 1
    found.append(Block(info, i + 2, "\n".join(body) + "\n"))
    last_end[len(found) - 1] = j + 1
    i = j + 1
  # A text block right after a python block is that block's output.
  merged: list[Block] = []
  for k, b in enumerate(found):
    prev = merged[-1] if merged else None
    if (b.info == "text" and prev is not None and prev.info == "python" and prev.output is None
        and all(not l.strip() for l in lines[last_end[k - 1]:b.line - 2])):
      prev.output = b.code
      continue
    merged.append(b)
  return merged


class ExampleError(AssertionError):
  pass


def run(text: str, name: str) -> int:
  """Execute the python blocks of ``text`` (page ``name``); return how many ran."""
  namespace = {"__name__": "__main__"}
  ran = 0
  for b in blocks(text):
    if b.info != "python":
      continue
    code = compile("\n" * (b.line - 1) + b.code, name, "exec")
    out = io.StringIO()
    try:
      with contextlib.redirect_stdout(out):
        exec(code, namespace)  # pylint: disable=exec-used
    except Exception as e:  # pylint: disable=broad-except
      tb = "".join(traceback.format_exception(e))
      raise ExampleError(f"{name}:{b.line}: the example raised\n{out.getvalue()}{tb}") from None
    ran += 1
    if b.output is not None and not _CHECKER.check_output(b.output, out.getvalue(), _FLAGS):
      diff = _CHECKER.output_difference(doctest.Example("", b.output), out.getvalue(), _FLAGS)
      raise ExampleError(f"{name}:{b.line}: the printed output differs from the text block "
                         f"below the example\n{diff}")
  return ran
