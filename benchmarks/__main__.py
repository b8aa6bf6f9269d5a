"""Run the benchmark suites and print one table.

    python -m benchmarks [--quick] [--only SUITE[,SUITE]] [--json PATH] [--strict]

Add a suite by appending ``(name, module)`` to :data:`SUITES`; the module
exposes ``run(quick: bool) -> list[benchmarks._harness.Row]``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

# jaxlib's CPU SVD/QR/eigh call LAPACK through scipy's OpenBLAS, whose threads
# compete with XLA's own thread pool: on a small shared CPU one 2048x512 SVD
# then varies 1-14 s instead of a steady 0.35 s. One OpenBLAS thread keeps
# LAPACK timings meaningful; it must be set before jax/scipy load. Override by
# setting the variable yourself.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from benchmarks import _harness  # noqa: E402

SUITES: list[tuple[str, str]] = [
    ("linalg", "benchmarks.linalg_bench"),
    ("optim", "benchmarks.optim_bench"),
    ("optim_profile", "benchmarks.optim_profile_bench"),
    ("gmp", "benchmarks.gmp_bench"),
    ("deep_mlp", "benchmarks.deep_mlp_bench"),
    ("resnet", "benchmarks.resnet_bench"),
    ("throughput", "benchmarks.throughput_bench"),
    ("input", "benchmarks.input_bench"),
    ("sharding", "benchmarks.sharding_bench"),
    ("analysis", "benchmarks.analysis_bench"),
    ("retraction", "benchmarks.retraction_bench"),
    ("resnet_optim", "benchmarks.resnet_optim_bench"),
    ("memory", "benchmarks.memory_bench"),
    ("scale", "benchmarks.scale_bench"),
    ("peers", "benchmarks.peers_bench"),
    ("loaded", "benchmarks.loaded_bench"),
    ("launches", "benchmarks.launches_bench"),
    ("gpu", "benchmarks.gpu_bench"),
    ("precision", "benchmarks.precision_bench"),
]


def main(argv: list[str] | None = None) -> int:
  names = [n for n, _ in SUITES]
  parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true",
                      help="fewer repeats and sizes (CPU smoke run, < 1 min per suite)")
  parser.add_argument("--only", default="", help=f"comma-separated suites from {names}")
  parser.add_argument("--json", default="", help="also write rows and device info to this file")
  parser.add_argument("--strict", action="store_true",
                      help="exit with status 1 if any applicable target is missed")
  args = parser.parse_args(argv)
  chosen = [s.strip() for s in args.only.split(",") if s.strip()] or names
  unknown = sorted(set(chosen) - set(names))
  if unknown:
    parser.error(f"unknown suite(s) {unknown}; available: {names}")

  desc = _harness.device_description()
  print(f"# device: {_harness.format_device(desc)}", flush=True)
  rows: list[_harness.Row] = []
  for name, module in SUITES:
    if name not in chosen:
      continue
    start = time.perf_counter()
    rows += importlib.import_module(module).run(quick=args.quick)
    print(f"# suite {name}: {time.perf_counter() - start:.1f} s", flush=True)
  print(_harness.format_table(rows))
  if args.json:
    _harness.write_json(args.json, rows, desc)
  missed = [r for r in rows if r.status == _harness.MISS]
  if missed:
    print(f"# {len(missed)} target(s) missed: " + "; ".join(f"{r.suite}/{r.case}" for r in missed))
  return 1 if (args.strict and missed) else 0


if __name__ == "__main__":
  sys.exit(main())
