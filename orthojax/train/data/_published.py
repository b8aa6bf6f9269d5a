"""Dataset shapes and sizes known without the files (tfds catalogue numbers).

The pod compile check (``--compile_for``) builds the exact train step of a
run on a machine that has neither the accelerators nor the data; it needs
only what :class:`DatasetInfo` says. For the tfds-backed sets those numbers
are the published split sizes of the tfds catalogue (the same numbers
``builder.info.splits`` reports once a set is prepared; a test checks the
mocked builders agree on shapes and classes). Sets generated in memory
(``fake``, ``digits``, the toy sets, UCI from a bundled CSV) need no entry:
their own ``info`` reads no files that could be missing.
"""

from __future__ import annotations

from typing import Any, Callable

from orthojax.train.data._info import DatasetInfo

IMAGENET_TRAIN, IMAGENET_VALIDATION = 1_281_167, 50_000


def _imagenet(name: str, opts: dict[str, Any]) -> DatasetInfo:
  side = opts["image_size"] if name == "imagenet2012" else 32
  return DatasetInfo(name=name, task="classification", input_shape=(side, side, 3),
                     num_classes=1000, num_train=IMAGENET_TRAIN,
                     num_eval=IMAGENET_VALIDATION, eval_split="validation")


def _small_images(train: int, test: int) -> Callable[[str, dict[str, Any]], DatasetInfo]:
  def info(name: str, opts: dict[str, Any]) -> DatasetInfo:
    shape = (32 * 32 * 3,) if opts["flatten"] else (32, 32, 3)
    return DatasetInfo(name=name, task="classification", input_shape=shape, num_classes=10,
                       num_train=train, num_eval=test, eval_split="test")
  return info


def _mnist(name: str, opts: dict[str, Any]) -> DatasetInfo:
  from orthojax.train.data import mnist  # pylint: disable=g-import-not-at-top  (no tf import)
  if opts["source"] != "tfds":
    return mnist.info(name, opts, None)   # the bundled subset: no files to miss
  mnist.check_options(opts)
  train = 60_000   # the trainer holds out the last fifth of tfds' train split for validation
  return DatasetInfo(name=name, task="classification", input_shape=mnist.SHAPES[opts["view"]],
                     num_classes=10, num_train=train - train // 5, num_eval=train // 5,
                     eval_split="validation")


PUBLISHED: dict[str, Callable[[str, dict[str, Any]], DatasetInfo]] = {
    "imagenet2012": _imagenet,
    "imagenet_resized/32x32": _imagenet,
    "cifar10": _small_images(50_000, 10_000),
    "svhn_cropped": _small_images(73_257, 26_032),
    "mnist": _mnist,
}
