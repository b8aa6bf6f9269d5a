"""Accelerator topologies without the accelerators: abstract devices and chip specs.

``jax.experimental.topologies.get_topology_desc`` describes a slice's devices —
their coordinates, hosts and slices — without the hardware, and compiling a
``jax.jit`` for a mesh over them yields the real executable:

* TPUs through ``libtpu`` (installs on any Linux machine; the ``tpu`` extra).
  Topologies are named the way ``gcloud`` and the Cloud TPU docs do
  (``v5e:4x4``, ``v4:2x2x4``, ``v5p:2x2x2``, ``v6e:8x8``: generation, then the
  chip grid).
* NVIDIA H100s through jax's CUDA plugin and the CUDA compiler wheels (the
  ``gpu-compile`` extra), from a target description instead of a device
  (openxla/xla#16913): ``h100:1x1x8`` is slices × hosts × GPUs per host. XLA
  cannot autotune without the GPU, so kernels get heuristic tilings; memory
  and FLOPs are the compiler's, a timing it cannot give.

Each chip's published specs feed the roofline bounds.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any


@dataclasses.dataclass(frozen=True)
class ChipSpec:
  """One TPU chip, as its generation's Cloud TPU system-architecture page states it.

  Attributes:
    name: the generation (``v5e``).
    peak_bf16_flops: peak dense bfloat16 FLOP/s per chip.
    hbm_bytes: high-bandwidth memory per chip.
    hbm_bandwidth: HBM bytes/s per chip.
    megacore: two TensorCores presented as one device (v4, v5p).
    source: where the numbers are published.
    platform: ``"tpu"`` or ``"cuda"``.
  """

  name: str
  peak_bf16_flops: float
  hbm_bytes: int
  hbm_bandwidth: float
  megacore: bool
  source: str
  platform: str = "tpu"


GiB = 2 ** 30
_DOCS = "https://cloud.google.com/tpu/docs/"

# Google's tables give "16 GB"/"32 GB"/"95 GB" of HBM; the chips carry 16, 32
# and 95 GiB (the compiler's per-chip limit is a little below that).
CHIPS: dict[str, ChipSpec] = {
    "v4": ChipSpec("v4", 275e12, 32 * GiB, 1200e9, True, _DOCS + "v4"),
    "v5e": ChipSpec("v5e", 197e12, 16 * GiB, 819e9, False, _DOCS + "v5e"),
    "v5p": ChipSpec("v5p", 459e12, 95 * GiB, 2765e9, True, _DOCS + "v5p"),
    "v6e": ChipSpec("v6e", 918e12, 32 * GiB, 1640e9, False, _DOCS + "v6e"),
    # SXM5 80 GB: 989 TFLOP/s dense bf16 (1,979 with 2:4 sparsity), 3.35 TB/s.
    "h100": ChipSpec("h100", 989e12, 80 * 10 ** 9, 3.35e12, False,
                     "https://www.nvidia.com/en-us/data-center/h100/", platform="cuda"),
}

# XLA's GpuTargetConfigProto of an H100 SXM5 80 GB (132 SMs, 50 MiB L2, compute
# capability 9.0): what the compiler would otherwise read off the device.
H100_TARGET_CONFIG = """gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 84942979072 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 8 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
_NAME = re.compile(r"^(v\d+[a-z]*|h100):(\d+(?:x\d+)+)$")


class TopologyError(ValueError):
  """A topology the compile check cannot build; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Topology:
  """A TPU slice (or several identical ones) described by name.

  Attributes:
    name: e.g. ``v5e:4x4``.
    chip: the generation's :class:`ChipSpec`.
    grid: chips per dimension, e.g. ``(4, 4)``.
    num_slices: identical slices joined over the data-centre network.
  """

  name: str
  chip: ChipSpec
  grid: tuple[int, ...]
  num_slices: int = 1

  @classmethod
  def parse(cls, name: str, num_slices: int = 1) -> "Topology":
    match = _NAME.match(name or "")
    if not match or match.group(1) not in CHIPS:
      raise TopologyError(
          f"--compile_for={name}: unknown topology; give a generation ({', '.join(CHIPS)}) "
          f"and a chip grid, e.g. v5e:4x4, v5e:8x8, v4:2x2x4, v5p:2x2x2, v6e:2x4, h100:1x1x8")
    if not isinstance(num_slices, int) or num_slices < 1:
      raise TopologyError(f"config.mesh.num_slices={num_slices}: must be an integer >= 1")
    grid = tuple(int(d) for d in match.group(2).split("x"))
    if 0 in grid:
      raise TopologyError(f"--compile_for={name}: a chip grid has no zero dimension")
    chip = CHIPS[match.group(1)]
    if chip.platform == "cuda" and (len(grid) != 3 or num_slices != 1):
      raise TopologyError(f"--compile_for={name}: GPU topologies are slices x hosts x GPUs per "
                          f"host, e.g. h100:1x1x8 or h100:1x2x8 (no config.mesh.num_slices)")
    return cls(name=name, chip=chip, grid=grid, num_slices=num_slices)

  @property
  def chips_per_slice(self) -> int:
    return math.prod(self.grid)

  @property
  def num_chips(self) -> int:
    return self.chips_per_slice * self.num_slices

  def devices(self) -> list[Any]:
    """Abstract devices of every slice (TPU: ``libtpu``; GPU: jax's CUDA plugin)."""
    if self.chip.platform == "cuda":
      return self._gpu_devices()
    if not libtpu_available():
      raise TopologyError("--compile_for: needs libtpu (pip install 'orthojax[tpu]', or the "
                          "libtpu version jax's 'tpu' extra names)")
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
    kwargs = {"chip_config_name": "megacore"} if self.chip.megacore else {}
    if self.num_slices > 1:
      kwargs["num_slices"] = self.num_slices
    _quiet_libtpu()
    try:
      description = topologies.get_topology_desc(
          topology_name=f"{self.chip.name}:{'x'.join(map(str, self.grid))}", platform="tpu",
          **kwargs)
    except Exception as e:   # libtpu's own message for a grid the generation does not have
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise TopologyError(f"--compile_for={self.name}: libtpu cannot build it ({first})") from e
    devices = list(description.devices)
    if len(devices) != self.num_chips:
      raise TopologyError(f"--compile_for={self.name}: libtpu gave {len(devices)} devices for "
                          f"{self.num_chips} chips")
    return devices


  def _gpu_devices(self) -> list[Any]:
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
    try:
      description = topologies.get_topology_desc(
          platform="cuda", topology="x".join(map(str, self.grid)),
          target_config=H100_TARGET_CONFIG)
    except Exception as e:   # no plugin, or a JAX_PLATFORMS that made it fail to register
      raise TopologyError(
          f"--compile_for={self.name}: jax's CUDA plugin cannot describe it ({type(e).__name__}"
          f"); pip install -e '.[gpu-compile]' and run with JAX_PLATFORMS=cpu") from e
    return list(description.devices)


def libtpu_available() -> bool:
  try:
    import libtpu  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


def _quiet_libtpu() -> None:
  """Keep libtpu from probing for TPU hosts (and warning) on a machine without them, and
  from locking ``/tmp/libtpu_lockfile``: compiling needs no chip, so several processes
  (test workers, a launcher beside a run) may load it at once.

  Logging (each only where the environment does not set it): jaxlib's INFO lines
  about loading libtpu (``GetPjrtApi was found for tpu at …``) are hidden
  (``TF_CPP_MIN_LOG_LEVEL=2``); libtpu's own log keeps INFO and WARNING lines off the
  terminal (``TPU_STDERR_LOG_LEVEL=3``: 0 INFO … 3 FATAL) — an error the compiler
  meets is raised, and the compile check prints it as one line (its own ERROR line
  would repeat it with pages of detail) — and writes no INFO files to
  ``TPU_LOG_DIR`` (``/tmp/tpu_logs``; ``TPU_MIN_LOG_LEVEL=1``: warnings and errors
  are still written there).
  """
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_WORKER_ID", "0")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("TPU_STDERR_LOG_LEVEL", "3")
  os.environ.setdefault("TPU_MIN_LOG_LEVEL", "1")
