"""Can this machine open a connection to a download's hosts? A quick probe before a download.

tfds retries a failed request ten times with exponential backoff (0.2 s · 2^k): offline,
a download that cannot happen takes 3 min 24 s to fail. :func:`unreachable` opens one
TCP connection per host (to the proxy the environment names for it, where there is one,
as ``requests`` would) with a short timeout, all hosts at once, and says which did not
answer — milliseconds online, at most ``timeout`` seconds offline, however name
resolution fails (``getaddrinfo`` has no timeout of its own, so each probe runs in a
daemon thread that is abandoned when it does not answer in time).
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.parse
import urllib.request
from typing import Iterable

TIMEOUT_S = 3.0
"""Seconds a host has to accept a connection."""

_PORTS = {"http": 80, "https": 443}


def _target(url: str) -> tuple[str, int] | None:
  """``(host, port)`` a request for ``url`` connects to (its proxy's, if the environment
  sets one for it), or None for a URL that is not http(s)."""
  parts = urllib.parse.urlsplit(url)
  if parts.scheme not in _PORTS or not parts.hostname:
    return None
  proxy = urllib.request.getproxies().get(parts.scheme)
  if proxy and not urllib.request.proxy_bypass(parts.hostname):
    proxied = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if proxied.hostname:
      return proxied.hostname, proxied.port or _PORTS.get(proxied.scheme, 80)
  return parts.hostname, parts.port or _PORTS[parts.scheme]


def unreachable(urls: Iterable[str], timeout: float = TIMEOUT_S) -> str | None:
  """``"host:port (why)"`` for a host of ``urls`` that takes no connection within
  ``timeout`` seconds, or None when every one does (URLs that are not http(s) are not
  probed)."""
  targets = sorted({t for t in map(_target, urls) if t is not None})
  errors: dict[tuple[str, int], str | None] = {}

  def connect(target: tuple[str, int]) -> None:
    try:
      socket.create_connection(target, timeout=timeout).close()
      errors[target] = None
    except OSError as e:
      errors[target] = str(e) or type(e).__name__

  threads = [threading.Thread(target=connect, args=(t,), daemon=True) for t in targets]
  for thread in threads:
    thread.start()
  deadline = time.monotonic() + timeout
  for thread in threads:
    thread.join(max(0.0, deadline - time.monotonic()))
  for host, port in targets:
    why = errors.get((host, port), f"no answer within {timeout:g} s")
    if why is not None:
      return f"{host}:{port} ({why})"
  return None
