"""Input pipeline vs. train step: which one bounds ImageNet training here.

Cases (E1's pipeline, :func:`orthojax.train.data.imagenet.train_preprocess`:
decode the random crop of a JPEG, resize to 224², flip, colour jitter and
PCA lighting, normalise):

* ``input, 1 core`` — images/s of the tf.data map with one thread
  (``private_threadpool_size=1``, ``max_intra_op_parallelism=1``): the rate
  each CPU core adds;
* ``input, all cores`` — images/s with ``num_parallel_calls=AUTOTUNE`` on
  every core of this machine;
* ``train step`` — images/s a ResNet-50 (BN) training step consumes at batch
  32 on the default device (:mod:`benchmarks.resnet_bench`'s step);
* ``input / train`` — the ratio; below 1 the input pipeline is the
  bottleneck, and ``train / (input per core)`` is how many cores keep up.

The JPEGs are a pool of 64 synthetic photographs at ImageNet's typical size
(about 400×350, smooth content plus texture, quality 90), so decoding costs
what it costs on real data; the pipeline is the same code as training. No
target: a CPU's train step is far slower than its input; on a GPU host the
ratio says how many cores feeding it needs.

``quick``: 256 images, ResNet-18 at batch 4 for the consumption rate.
"""

from __future__ import annotations

import time

import jax
import numpy as np
import optax
from flax import nnx

from benchmarks._harness import Row
from benchmarks._harness import row
from benchmarks._harness import time_fn
from benchmarks.resnet_bench import _train_step
from orthojax import models

SUITE = "input"


def _jpegs(tf, count: int, seed: int = 0) -> list[bytes]:
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    h, w = int(rng.integers(300, 480)), int(rng.integers(330, 500))
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = (np.sin(x[..., None] / rng.uniform(20, 60) + np.arange(3)) * 60
            + np.cos(y[..., None] / rng.uniform(20, 60)) * 50 + 128)
    image = np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
    out.append(tf.io.encode_jpeg(image, quality=90).numpy())
  return out


def _images_per_sec(tf, jpegs: list[bytes], images: int, parallel: bool) -> float:
  from orthojax.train.data import imagenet  # pylint: disable=g-import-not-at-top
  ds = tf.data.Dataset.from_tensor_slices(jpegs).repeat().enumerate()
  preprocess = lambda i, jpeg: imagenet.train_preprocess(jpeg, tf.stack([i, i * 7 + 1]))
  if parallel:
    ds = ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  else:
    ds = ds.map(preprocess)
  ds = ds.batch(32, drop_remainder=True).prefetch(2 if parallel else 0)
  options = tf.data.Options()
  if not parallel:
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
  ds = ds.with_options(options)
  it = iter(ds)
  next(it)  # warm up (trace, first decode)
  batches = max(images // 32, 1)
  start = time.perf_counter()
  for _ in range(batches):
    next(it)
  return batches * 32 / (time.perf_counter() - start)


def run(quick: bool = False) -> list[Row]:
  from orthojax.train.data._tf import tf  # pylint: disable=g-import-not-at-top
  jpegs = _jpegs(tf, 64)
  images = 256 if quick else 1024
  one = _images_per_sec(tf, jpegs, images, parallel=False)
  every = _images_per_sec(tf, jpegs, images, parallel=True)

  depth, batch = (18, 4) if quick else (50, 32)
  model = models.ResNet(depth, "bn", num_classes=1000, rngs=nnx.Rngs(0))
  step, state = _train_step(model, optax.sgd(0.1, momentum=0.9))
  x = jax.random.normal(jax.random.key(0), (batch, 224, 224, 3))
  y = jax.random.randint(jax.random.key(1), (batch,), 0, 1000)
  seconds = time_fn(step, *state, x, y, warmup=1, repeats=2 if quick else 3)
  train = batch / seconds
  cores = jax.local_devices()[0].platform
  return [
      row(SUITE, "input, 1 core (decode+crop+flip+colour, 224²)", one, "img/s",
          note=f"{len(jpegs)} synthetic ~400x350 JPEGs"),
      row(SUITE, "input, all cores (AUTOTUNE)", every, "img/s", note=f"{_cpus()} CPUs"),
      row(SUITE, f"train step, ResNet-{depth} bn, batch {batch}", train, "img/s",
          note=f"on {cores}"),
      row(SUITE, "input (all cores) / train step", every / train, "x",
          note="< 1: the input pipeline bounds training"),
      row(SUITE, "cores needed to feed the train step", train / one, "cores",
          note="train img/s ÷ input img/s per core"),
  ]


def _cpus() -> int:
  import os  # pylint: disable=g-import-not-at-top
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
