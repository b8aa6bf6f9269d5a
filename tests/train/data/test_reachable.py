"""A tfds download that cannot happen fails at once, in one line; one that can goes on.

No test touches the network: the probe's ``socket.create_connection`` and tfds'
``download_and_prepare`` are replaced.
"""

from __future__ import annotations

import os
import socket
import time

import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import resource

from orthojax.train import data
from orthojax.train.data import _reachable
from orthojax.train.data import _tfds

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


@pytest.fixture
def downloads(monkeypatch):
  """The calls tfds' download_and_prepare gets (none is made)."""
  calls = []
  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare",
                      lambda self, *a, **k: calls.append(self.name))
  return calls


@pytest.fixture
def probes(monkeypatch):
  """The hosts the probe connects to; ``probes.error`` (if set) is raised for each."""
  class Probes(list):
    error: OSError | None = None

  seen = Probes()

  def connect(target, timeout):
    seen.append((target, timeout))
    if seen.error is not None:
      raise seen.error
    return socket.socket()   # closed by the probe

  monkeypatch.setattr(_reachable.socket, "create_connection", connect)
  for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
    monkeypatch.delenv(var, raising=False)
  return seen


def test_an_unreachable_download_host_fails_fast_in_one_line(tmp_path, downloads, probes):
  probes.error = socket.gaierror(-2, "Name or service not known")
  start = time.monotonic()
  with pytest.raises(data.DatasetNotFoundError) as err:
    _tfds.prepared_builder("tiny_shakespeare", str(tmp_path))
  assert time.monotonic() - start < 5
  message = str(err.value)
  assert "\n" not in message
  assert message.startswith(f"tiny_shakespeare is not prepared in {tmp_path} (tfds data_dir) "
                            f"and downloading it failed: ConnectionError: cannot reach "
                            f"raw.githubusercontent.com:443 (")
  assert f"`tfds build tiny_shakespeare --data_dir={tmp_path}`" in message
  assert [t for t, _ in probes] == [("raw.githubusercontent.com", 443)]
  assert downloads == []   # tfds' retries (3 min 24 s offline) never start


def test_a_reachable_host_goes_on_to_tfds(tmp_path, downloads, probes):
  builder = _tfds.prepared_builder("tiny_shakespeare", str(tmp_path))
  assert downloads == ["tiny_shakespeare"] and builder.name == "tiny_shakespeare"
  assert [t for t, _ in probes] == [("raw.githubusercontent.com", 443)]
  assert probes[0][1] == _reachable.TIMEOUT_S


@pytest.mark.parametrize("folder", ["tiny_shakespeare", ""])
def test_files_already_downloaded_are_not_probed(tmp_path, downloads, probes, folder):
  """Offline with tfds' download already on disk (a build cut short): tfds goes on."""
  builder = tfds.builder("tiny_shakespeare", data_dir=str(tmp_path))
  name = resource.get_dl_fname(URL, builder.url_infos[URL].checksum)
  os.makedirs(tmp_path / "downloads" / folder)
  (tmp_path / "downloads" / folder / name).write_text("First Citizen:\n")
  probes.error = socket.gaierror(-2, "Name or service not known")
  _tfds.prepared_builder("tiny_shakespeare", str(tmp_path))
  assert probes == [] and downloads == ["tiny_shakespeare"]


def test_a_host_that_does_not_answer_is_given_up_after_the_timeout(monkeypatch):
  monkeypatch.setattr(_reachable.socket, "create_connection",
                      lambda target, timeout: time.sleep(30))   # a black-holed network
  start = time.monotonic()
  why = _reachable.unreachable([URL, "https://example.org/a"], timeout=0.2)
  assert time.monotonic() - start < 2
  assert why == "example.org:443 (no answer within 0.2 s)"


def test_the_probe_goes_to_the_proxy_and_skips_what_it_cannot_probe(monkeypatch, probes):
  monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
  monkeypatch.setenv("NO_PROXY", "mirror.internal")
  assert _reachable.unreachable([URL, "https://mirror.internal:8443/x",
                                 "gs://bucket/file", "ftp://host/file"]) is None
  assert sorted(t for t, _ in probes) == [("mirror.internal", 8443), ("proxy.internal", 3128)]
  probes.error = ConnectionRefusedError(111, "Connection refused")
  assert _reachable.unreachable([URL]) == "proxy.internal:3128 ([Errno 111] Connection refused)"
