"""Code per backend, chosen when the program is lowered, without tracing what can never run.

``jax.lax.platform_dependent(*args, cpu=f, default=g)`` stages out every branch and keeps
the one of the platform the program is lowered for, so a deviceless compile for a GPU or
TPU gets that backend's code (how :func:`orthojax.linalg.at_precision` picks a precision).
Nested, it multiplies the tracing: the update's products run at the manifold's precision
(one choice), each retraction adds its float32 correction where they are reduced (a
second, inside both branches of the first), a QR solves on a CPU and inverts on an
accelerator (a third)…, and every level traces both branches of the one above.

:func:`platform_dependent` is jax's, with one difference: a branch knows the platforms that
select it, because only those can ever lower it. A call nested in the CPU branch of
another has its CPU branch traced alone; one nested in an accelerator branch whose
platforms all select the same code has that code traced alone. The program lowered for
any platform is unchanged — the same branch is kept — and its tracing is one pass per
distinct outcome instead of one per path through the nest. What the branch knows lasts
while it is traced (a trace-time fact, like jax's name stack), never into a later trace;
it is no option: nothing a user sets changes, and no program does.

Measured on ResNet-18's radam update (conv kernels, iterative Cayley, bucketed): 161 choices
traced before, 81 after, and the update's trace and lowering 0.62 → 0.43 s on a 2-core AMD
EPYC (docs/performance.md, "Fewer kernels and less tracing per update").
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import jax

_PLATFORMS = frozenset({"cpu", "cuda", "rocm", "tpu", None})
"""The platforms a program may be lowered for, as ``jax.lax.platform_dependent`` names
them; None stands for every other one (its ``default``)."""

_tracing = threading.local()


def _selecting() -> frozenset:
  """The platforms whose branch is being traced (all of them outside any branch)."""
  return getattr(_tracing, "platforms", _PLATFORMS)


@contextlib.contextmanager
def _inside(platforms: frozenset) -> Iterator[None]:
  outer = _selecting()
  _tracing.platforms = platforms
  try:
    yield
  finally:
    _tracing.platforms = outer


def platform_dependent(*args: Any, default: Callable[..., Any],
                       **per_platform: Callable[..., Any]) -> Any:
  """``jax.lax.platform_dependent(*args, default=default, **per_platform)``, tracing only
  the branches the enclosing one's platforms can select (module docstring).

  Args:
    *args: passed to the branch.
    default: the branch of every platform not named.
    **per_platform: branches by platform name (``cpu``, ``cuda``, ``rocm``, ``tpu``).

  Returns:
    The value of the branch of the platform the program runs on.
  """
  unknown = set(per_platform) - _PLATFORMS
  if unknown:
    raise ValueError(f"platform_dependent: unknown platform(s) {sorted(unknown)}; name "
                     f"{sorted(p for p in _PLATFORMS if p)}")
  branches: dict[Callable[..., Any], set] = {}   # each distinct branch: its platforms here
  for platform in _selecting():
    branches.setdefault(per_platform.get(platform, default) if platform else default,
                        set()).add(platform)

  def traced(branch: Callable[..., Any], platforms: set) -> Callable[..., Any]:
    def run(*a):
      with _inside(frozenset(platforms)):
        return branch(*a)
    return run

  # One callable per branch: jax traces a callable named for several platforms once.
  wrapped = [(traced(branch, platforms), platforms) for branch, platforms in branches.items()]
  if len(wrapped) == 1:   # every platform that can lower this selects one branch: no choice
    return wrapped[0][0](*args)
  # The default branch, else any (no unnamed platform can lower this): not named again.
  fallback = next((run for run, platforms in wrapped if None in platforms), wrapped[0][0])
  named = {platform: run for run, platforms in wrapped if run is not fallback
           for platform in platforms}
  return jax.lax.platform_dependent(*args, default=fallback, **named)
