"""ImageNet (E1) and ImageNet32 (E2): tfds streams with the papers' augmentation.

``imagenet2012`` training augmentation (the scale augmentation of
He et al. 2016 §3.4 with the colour augmentation of Krizhevsky et al. 2012
as in fb.resnet.torch):

1. **random scale + crop**: draw the shorter side ``S ~ U{min_scale..max_scale}``
   (default 256..480), i.e. resize keeping the aspect ratio, and take a
   uniformly placed ``image_size``² (224²) crop. Computed in the *original*
   image: the crop is the ``224·s₀/S`` square (``s₀`` = shorter side) at a
   uniform offset, which ``tf.image.decode_and_crop_jpeg`` decodes alone
   (the rest of the JPEG is never decoded), then resized to 224² (bilinear,
   antialiased). Same distribution as resizing the whole image first, at a
   fraction of the cost;
2. **horizontal flip** with probability 1/2;
3. **colour jitter** (on ``[0, 1]`` pixels), in this order: brightness
   ``x·a``, contrast ``(x − mean(gray(x)))·a + mean(gray(x))``, saturation
   ``(x − gray(x))·a + gray(x)``, each with its own ``a ~ U[1 − c, 1 + c]``,
   ``c = color_jitter = 0.4``;
4. **PCA lighting noise** (AlexNet): add ``V·(α ⊙ λ)`` to every pixel,
   ``α ~ N(0, lighting²)``, ``lighting = 0.1``, with the ImageNet RGB
   eigenvalues ``λ`` and eigenvectors ``V`` below. Pixels are not clipped;
5. **normalisation** ``(x − mean)/std`` with the ImageNet RGB mean/std.

Evaluation: resize the shorter side to ``eval_resize`` (256, bilinear,
antialiased; the longer side rounded), centre-crop 224² (offsets rounded
down), normalise.

All randomness is stateless, seeded per example by the pipeline (see
:mod:`orthojax.train.data._tfds`). ``x`` is float32 ``(224, 224, 3)``.

``imagenet_resized/32x32`` (ImageNet32, Chrabaszcz et al. 2017; E2):
random horizontal flip, then the same mean/std normalisation; evaluation:
normalisation only. ``x`` is float32 ``(32, 32, 3)``.

When ``imagenet2012`` is missing, the error spells out the manual download
(tfds cannot fetch ImageNet). ``imagenet_resized`` is downloaded by tfds.

References:
  He et al., "Deep Residual Learning for Image Recognition", CVPR 2016.
  Krizhevsky et al., "ImageNet Classification with Deep Convolutional Neural
  Networks", NeurIPS 2012 (PCA lighting).
  Chrabaszcz et al., "A Downsampled Variant of ImageNet as an Alternative to
  the CIFAR datasets", 2017.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

from orthojax.train.data import _tfds
from orthojax.train.data._info import DatasetInfo
from orthojax.train.data._info import resolve_split
from orthojax.train.data._tf import tf

MEAN_RGB = (0.485, 0.456, 0.406)
STDDEV_RGB = (0.229, 0.224, 0.225)
# PCA of ImageNet RGB pixels in [0, 1] (Krizhevsky et al. 2012; the values
# fb.resnet.torch uses): eigenvalues and eigenvectors (columns).
PCA_EIGVAL = (0.2175, 0.0188, 0.0045)
PCA_EIGVEC = ((-0.5675, 0.7192, 0.4009),
              (-0.5808, -0.0045, -0.8140),
              (-0.5836, -0.6948, 0.4203))

SPLITS = ("validation", "train")


def manual_download_message(root: str) -> str:
  """What to do when ``imagenet2012`` is not prepared under ``root``."""
  manual = f"{root}/downloads/manual"
  return (
      f"imagenet2012 is not prepared in {root} (the tfds data_dir). TFDS cannot download "
      f"ImageNet itself; once per machine (or shared file system):\n"
      f"  1. Register at https://image-net.org/download-images and download "
      f"ILSVRC2012_img_train.tar (~138 GiB) and ILSVRC2012_img_val.tar (~6.3 GiB) "
      f"(ILSVRC 2012, 'Training images (Task 1 & 2)' and 'Validation images (all tasks)').\n"
      f"  2. Put both .tar files, unextracted, in {manual}/ (tfds' manual_dir).\n"
      f"  3. Run: {_tfds.build_command('imagenet2012', root)}\n"
      f"     (with the .tar files elsewhere add --manual_dir=/path/to/tars; the build takes "
      f"hours and ~150 GB more disk).\n"
      f"  4. Train with config.data.data_dir={root}.\n"
      f"For a smoke test without ImageNet use config.data.name='fake' (or tfds.testing.mock_data "
      f"in tests).")


# ------------------------------------------------------------- Transforms --

def _uniform(seed: tf.Tensor, minval: float = 0.0, maxval: float = 1.0, shape=()) -> tf.Tensor:
  return tf.random.stateless_uniform(shape, seed, minval=minval, maxval=maxval)


def _normalize(image: tf.Tensor) -> tf.Tensor:
  """``[0, 1]`` RGB -> ``(x − mean) / std``."""
  return (image - tf.constant(MEAN_RGB)) / tf.constant(STDDEV_RGB)


def random_scale_crop(jpeg: tf.Tensor, seed: tf.Tensor, image_size: int = 224,
                      min_scale: int = 256, max_scale: int = 480) -> tf.Tensor:
  """Resize (shorter side ``S ~ U{min_scale..max_scale}``) and random-crop, from JPEG bytes.

  Args:
    jpeg: scalar string tensor, an encoded JPEG.
    seed: ``[2]`` int64 stateless seed.
    image_size: output side.
    min_scale, max_scale: range of the shorter side after resizing.

  Returns:
    float32 ``(image_size, image_size, 3)`` in ``[0, 1]``.
  """
  s_scale, s_y, s_x = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
  shape = tf.io.extract_jpeg_shape(jpeg)
  h, w = shape[0], shape[1]
  short = tf.cast(tf.minimum(h, w), tf.float32)
  scale = tf.random.stateless_uniform((), s_scale, minval=min_scale, maxval=max_scale + 1,
                                      dtype=tf.int32)
  side = tf.cast(tf.round(image_size * short / tf.cast(scale, tf.float32)), tf.int32)
  side = tf.clip_by_value(side, 1, tf.minimum(h, w))
  y0 = tf.cast(tf.floor(_uniform(s_y) * tf.cast(h - side + 1, tf.float32)), tf.int32)
  x0 = tf.cast(tf.floor(_uniform(s_x) * tf.cast(w - side + 1, tf.float32)), tf.int32)
  y0, x0 = tf.minimum(y0, h - side), tf.minimum(x0, w - side)
  crop = tf.image.decode_and_crop_jpeg(jpeg, tf.stack([y0, x0, side, side]), channels=3)
  crop = tf.image.resize(crop, (image_size, image_size), method="bilinear", antialias=True)
  return crop / 255.0


def color_augment(image: tf.Tensor, seed: tf.Tensor, color_jitter: float = 0.4,
                  lighting: float = 0.1) -> tf.Tensor:
  """Brightness, contrast, saturation jitter, then PCA lighting noise (``[0, 1]`` RGB).

  Args:
    image: float32 ``(h, w, 3)`` in ``[0, 1]``.
    seed: ``[2]`` int64 stateless seed.
    color_jitter: ``c`` — each factor is drawn from ``U[1 − c, 1 + c]``; 0 = off.
    lighting: standard deviation of the PCA coefficients; 0 = off.
  """
  s_b, s_c, s_s, s_l = tf.unstack(tf.random.experimental.stateless_split(seed, 4))
  if color_jitter:
    lo, hi = 1.0 - color_jitter, 1.0 + color_jitter
    image = image * _uniform(s_b, lo, hi)
    gray = tf.image.rgb_to_grayscale(image)
    mean = tf.reduce_mean(gray)
    image = (image - mean) * _uniform(s_c, lo, hi) + mean
    gray = tf.image.rgb_to_grayscale(image)
    image = (image - gray) * _uniform(s_s, lo, hi) + gray
  if lighting:
    alpha = tf.random.stateless_normal((3,), s_l, stddev=lighting)
    rgb = tf.linalg.matvec(tf.constant(PCA_EIGVEC), alpha * tf.constant(PCA_EIGVAL))
    image = image + rgb
  return image


def train_preprocess(jpeg: tf.Tensor, seed: tf.Tensor, *, image_size: int = 224,
                     min_scale: int = 256, max_scale: int = 480, color_jitter: float = 0.4,
                     lighting: float = 0.1) -> tf.Tensor:
  """The full E1 training augmentation of one encoded JPEG (module docstring).

  Returns:
    float32 ``(image_size, image_size, 3)``, normalised.
  """
  s_crop, s_flip, s_color = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
  image = random_scale_crop(jpeg, s_crop, image_size, min_scale, max_scale)
  image = tf.image.stateless_random_flip_left_right(image, s_flip)
  image = color_augment(image, s_color, color_jitter, lighting)
  return tf.ensure_shape(_normalize(image), (image_size, image_size, 3))


def eval_preprocess(image: tf.Tensor, *, image_size: int = 224,
                    eval_resize: int = 256) -> tf.Tensor:
  """Resize the shorter side to ``eval_resize``, centre-crop ``image_size``², normalise.

  Args:
    image: decoded ``(h, w, 3)`` image with values in ``[0, 255]`` (any dtype).

  Returns:
    float32 ``(image_size, image_size, 3)``.
  """
  shape = tf.shape(image)
  h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
  ratio = eval_resize / tf.minimum(h, w)
  new_h = tf.cast(tf.round(h * ratio), tf.int32)
  new_w = tf.cast(tf.round(w * ratio), tf.int32)
  resized = tf.image.resize(tf.cast(image, tf.float32), tf.stack([new_h, new_w]),
                            method="bilinear", antialias=True)
  top, left = (new_h - image_size) // 2, (new_w - image_size) // 2
  crop = resized[top:top + image_size, left:left + image_size]
  return tf.ensure_shape(_normalize(crop / 255.0), (image_size, image_size, 3))


def imagenet32_preprocess(image: tf.Tensor, seed: tf.Tensor | None, *,
                          flip: bool = True) -> tf.Tensor:
  """ImageNet32: optional random horizontal flip (``seed`` not None), normalise."""
  image = tf.cast(image, tf.float32) / 255.0
  if seed is not None and flip:
    image = tf.image.stateless_random_flip_left_right(image, seed)
  return _normalize(image)


# --------------------------------------------------------------- Datasets --

def _builder(name: str, data_dir: str | None, opts: dict) -> tfds.core.DatasetBuilder:
  if name == "imagenet2012":
    return _tfds.prepared_builder(name, data_dir, manual_instructions=manual_download_message)
  return _tfds.prepared_builder(name, data_dir, download=opts["download"])


def _eval_split(split: str) -> str:
  return resolve_split(split, SPLITS, eval_split="validation")


def info(name: str, opts: dict, data_dir: str | None) -> DatasetInfo:
  builder = _builder(name, data_dir, opts)
  side = opts["image_size"] if name == "imagenet2012" else 32
  return DatasetInfo(name=name, task="classification", input_shape=(side, side, 3),
                     num_classes=int(builder.info.features["label"].num_classes),
                     num_train=_tfds.num_examples(builder, "train"),
                     num_eval=_tfds.num_examples(builder, "validation"),
                     eval_split="validation")


def train_batches(name: str, opts: dict, *, batch_size: int, seed: int, start_batch: int,
                  data_dir: str | None, process_index: int, process_count: int
                  ) -> Iterator[dict[str, np.ndarray]]:
  if batch_size is None:
    raise ValueError(f"{name}: batch_size=-1 (the whole split) is not supported; "
                     f"give a per-process batch size")
  builder = _builder(name, data_dir, opts)
  if name == "imagenet2012":
    aug = {k: opts[k] for k in ("image_size", "min_scale", "max_scale", "color_jitter",
                                "lighting")}
    decoders = {"image": tfds.decode.SkipDecoding()}

    def preprocess(example, seed):
      return train_preprocess(example["image"], seed, **aug), tf.cast(example["label"], tf.int32)
  else:
    decoders = None

    def preprocess(example, seed):
      x = imagenet32_preprocess(example["image"], seed, flip=opts["flip"])
      return x, tf.cast(example["label"], tf.int32)

  return _tfds.stream_train(builder, split="train", batch_size=batch_size, seed=seed,
                            start_batch=start_batch, process_index=process_index,
                            process_count=process_count, preprocess=preprocess,
                            shuffle_buffer=opts["shuffle_buffer"], decoders=decoders)


def eval_batches(name: str, opts: dict, *, split: str, batch_size: int | None,
                 data_dir: str | None, process_index: int, process_count: int
                 ) -> Iterator[dict[str, np.ndarray]]:
  split = _eval_split(split)
  builder = _builder(name, data_dir, opts)
  if name == "imagenet2012":
    sizes = dict(image_size=opts["image_size"], eval_resize=opts["eval_resize"])

    def preprocess(example):
      image = tf.io.decode_jpeg(example["image"], channels=3)
      return eval_preprocess(image, **sizes), tf.cast(example["label"], tf.int32)
    decoders = {"image": tfds.decode.SkipDecoding()}
  else:
    def preprocess(example):
      return imagenet32_preprocess(example["image"], None), tf.cast(example["label"], tf.int32)
    decoders = None
  return _tfds.stream_eval(builder, split=split, batch_size=batch_size,
                           process_index=process_index, process_count=process_count,
                           preprocess=preprocess, decoders=decoders)
