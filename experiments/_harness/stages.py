"""An experiment in stages: ``--stages`` picks which of the experiment's stages run.

An experiment with stages (E5: ``probe``, ``init``, ``train``; E8: ``probe``, ``train``)
names them in the order they run and a default; the user picks some with
``--stages=a,b``. Each stage resumes on its own (a probe's trials, a measured record, a
trained run are read back), so a later invocation may add a stage to a workdir that
holds the earlier ones' output. The report (:func:`~experiments._harness.driver.main`'s
summary) is written after whichever stages ran.

The flag is shared (one process may import several experiments, e.g. pytest), so its
values are checked by :func:`chosen_stages` against the experiment's own stages, as
``--variants`` is: an unknown stage is one line and exit status 2 before any work.
"""

from __future__ import annotations

from typing import Sequence

from absl import flags

from experiments._harness import cli


def define_stages_flag() -> None:
  """``--stages`` (defined once per process; its values are checked by
  :func:`chosen_stages`)."""
  if "stages" in flags.FLAGS:
    return
  flags.DEFINE_list("stages", [], "The experiment's stages to run (its docstring lists them; "
                    "they run in its order, whatever the order here); empty: its default.")


def chosen_stages(value: Sequence[str], order: Sequence[str],
                  default: Sequence[str]) -> tuple[str, ...]:
  """The stages to run, in the experiment's ``order``.

  Args:
    value: the stages asked for (``--stages``; empty: ``default``).
    order: every stage of the experiment, in the order they run.
    default: the stages run when ``value`` is empty.

  Returns:
    The stages asked for, each once, in ``order``.

  Raises:
    ConfigError: a stage not in ``order`` (one line naming the flag and the choices).
  """
  asked = cli.flag_list("stages", list(value) or list(default), order)
  return tuple(stage for stage in order if stage in asked)
