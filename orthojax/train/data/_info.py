"""What a dataset looks like to the trainer (:class:`DatasetInfo`), and the
error raised when its files are missing (:class:`DatasetNotFoundError`).

Kept free of TensorFlow so that the model zoo and the trainer can size a
model without importing ``tf`` (a few seconds) for datasets that do not need
it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

TASKS = ("classification", "regression")
INPUT_DTYPES = ("float32", "int32")


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """Shape and size of a dataset as the model sees it.

  Attributes:
    name: the registry name (``"mnist"``, ``"uci/boston"``, ...).
    task: ``"classification"`` (``y`` int32 labels in ``[0, num_classes)``)
      or ``"regression"`` (``y`` float32 targets, one per example).
    input_shape: one example's ``x`` as the model receives it, e.g.
      ``(224, 224, 3)``, ``(28, 28)`` (28 steps of 28 features), ``(784, 1)``,
      ``(13,)``.
    num_classes: number of classes; None for regression.
    num_train: global number of training examples (before any per-process
      split or ``drop_remainder``).
    num_eval: global number of examples in the ``"eval"`` split, each of
      which :func:`eval_batches` yields exactly once (padded and masked).
    eval_split: which split ``"eval"`` means for this dataset: the
      validation split where the dataset has one (model selection, early
      stopping), otherwise the test split.
    target_mean, target_std: regression targets are standardised with these
      (fitted on the training split); multiply an RMSE/MAE on standardised
      targets by ``target_std`` to report it in the original units. None
      where targets are not standardised.
    input_dtype: dtype of ``x``: ``"float32"`` (features, pixels) or
      ``"int32"`` (token ids of a language model, in ``[0, num_classes)``).
    target_shape: one example's ``y`` beyond the batch axis: ``()`` for one
      label or target per example, ``(T,)`` for a language model's
      next-token labels (a classification per position; losses and
      accuracies are averaged over the positions of an example).
    checksum: what identifies the examples where the options alone do not (a text
      corpus: the sha256 of its text, which fixes the vocabulary too), or None. A run
      records it and refuses to resume on data with another.
  """

  name: str
  task: str
  input_shape: tuple[int, ...]
  num_classes: int | None
  num_train: int
  num_eval: int
  eval_split: str = "test"
  target_mean: float | None = None
  target_std: float | None = None
  input_dtype: str = "float32"
  target_shape: tuple[int, ...] = ()
  checksum: str | None = None

  def __post_init__(self):
    if self.task not in TASKS:
      raise ValueError(f"DatasetInfo.task must be one of {TASKS}, got {self.task!r}")
    if self.input_dtype not in INPUT_DTYPES:
      raise ValueError(f"DatasetInfo.input_dtype must be one of {INPUT_DTYPES}, "
                       f"got {self.input_dtype!r}")

  def batch_spec(self, batch_size: int, *, eval: bool = False) -> dict[str, tuple[tuple[int, ...], np.dtype]]:  # pylint: disable=redefined-builtin
    """``{key: (shape, dtype)}`` of one batch as the pipelines yield it.

    ``x`` :attr:`input_dtype` ``(batch, *input_shape)``; ``y`` int32 labels or
    float32 targets ``(batch, *target_shape)`` (``(batch,)`` but for language
    models); evaluation batches add the float32 ``mask`` ``(batch,)``. The
    trainer compiles its steps for exactly this (a test holds every pipeline
    to it).
    """
    spec = {"x": ((batch_size,) + tuple(self.input_shape), np.dtype(self.input_dtype)),
            "y": ((batch_size,) + tuple(self.target_shape),
                  np.dtype(np.int32 if self.task == "classification" else np.float32))}
    if eval:
      spec["mask"] = ((batch_size,), np.dtype(np.float32))
    return spec


class DatasetNotFoundError(FileNotFoundError):
  """A dataset's files are missing; the message says exactly how to get them."""


def resolve_split(split: str, splits: tuple[str, ...], eval_split: str) -> str:
  """The dataset split that ``split`` names: ``"eval"`` means ``eval_split``.

  Raises:
    ValueError: ``split`` is neither ``"eval"`` nor one of ``splits``.
  """
  if split == "eval":
    return eval_split
  if split not in splits:
    raise ValueError(f"unknown split {split!r}; choose one of {('eval',) + tuple(splits)}")
  return split
