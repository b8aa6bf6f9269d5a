"""Dataset shapes and sizes known without the files (tfds catalogue numbers).

The pod compile check (``--compile_for``) builds the exact train step of a
run on a machine that has neither the accelerators nor the data; it needs
only what :class:`DatasetInfo` says. For the tfds-backed sets those numbers
are the published split sizes of the tfds catalogue (the same numbers
``builder.info.splits`` reports once a set is prepared; a test checks the
mocked builders agree on shapes and classes). Sets generated in memory
(``fake``, ``digits``, the toy sets, UCI from a bundled CSV) need no entry:
their own ``info`` reads no files that could be missing.

Text sets publish their size in tokens and their character vocabulary; the
splits, windows and :class:`DatasetInfo` follow from the options exactly as
:func:`orthojax.train.data.text.info` computes them from the corpus:

* ``shakespeare``: measured on the prepared corpus
  (``python -m orthojax.train.data.text --prepare shakespeare``, then
  ``text.corpus_info("shakespeare")`` at ``level="char"`` and ``"byte"``):
  5,053,943 characters, all ASCII (as many UTF-8 bytes), 84 distinct
  characters; with the default fractions 4,548,549 / 252,697 / 252,697 tokens
  of train / validation / test. Its sha256 is :data:`SHAKESPEARE_SHA256`.
* ``tiny_shakespeare`` (and ``tfds_text`` naming it): tfds' 90/5/5 cut of
  Karpathy's 1,115,394 ASCII characters (``int(0.9 n)`` = 1,003,854 train,
  then 55,770 validation, 55,770 test), 65 distinct characters.
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


SHAKESPEARE_TOKENS, SHAKESPEARE_VOCAB = 5_053_943, 84
SHAKESPEARE_SHA256 = "e94e05538b0baa1237494f1eaa7d12639e573443e22890ae1feef9b94fca5d9e"
TINY_SHAKESPEARE_SPLITS = {"train": 1_003_854, "validation": 55_770, "test": 55_770}
TINY_SHAKESPEARE_VOCAB = 65


def _text(name: str, opts: dict[str, Any]) -> DatasetInfo:
  from orthojax.train.data import text  # pylint: disable=g-import-not-at-top  (no tf import)
  text.check_options(name, opts)
  if name == "tfds_text" and opts["tfds_name"] != "tiny_shakespeare":
    return text.info(name, opts, None)   # no published numbers: read the prepared set
  if name == "shakespeare":
    sizes = text.split_lengths(SHAKESPEARE_TOKENS, opts["validation_fraction"],
                               opts["test_fraction"])
    vocab, cut = SHAKESPEARE_VOCAB, True
  else:
    sizes, vocab, cut = dict(TINY_SHAKESPEARE_SPLITS), TINY_SHAKESPEARE_VOCAB, False
  vocab = text.BYTE_VOCAB if opts["level"] == "byte" else vocab   # ASCII: bytes = characters
  unit = "bytes" if opts["level"] == "byte" else "characters"
  text.check_context(name, opts["context"], sizes, unit, cut)
  return text.info_from_sizes(name, opts, sizes, vocab)


PUBLISHED: dict[str, Callable[[str, dict[str, Any]], DatasetInfo]] = {
    "imagenet2012": _imagenet,
    "imagenet_resized/32x32": _imagenet,
    "cifar10": _small_images(50_000, 10_000),
    "svhn_cropped": _small_images(73_257, 26_032),
    "mnist": _mnist,
    "shakespeare": _text,
    "tiny_shakespeare": _text,
    "tfds_text": _text,
}
