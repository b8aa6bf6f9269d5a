"""ImageNet augmentation and evaluation transforms, and the missing-data message."""

from __future__ import annotations

import numpy as np
import pytest

from orthojax.train import data
from orthojax.train.data import imagenet
from orthojax.train.data._tf import tf

_MEAN, _STD = np.array(imagenet.MEAN_RGB), np.array(imagenet.STDDEV_RGB)


def _jpeg(image: np.ndarray, chroma_downsampling: bool = True) -> tf.Tensor:
  return tf.io.encode_jpeg(tf.constant(image, tf.uint8), quality=95,
                           chroma_downsampling=chroma_downsampling)


def _ramp(h: int, w: int) -> np.ndarray:
  """Gray, brightening left to right."""
  row = np.linspace(20, 235, w)
  return np.broadcast_to(row[None, :, None], (h, w, 3)).round().astype(np.uint8)


def _seed(i: int) -> tf.Tensor:
  return tf.constant([17, i], tf.int64)


def test_train_output_is_224_and_flips_happen():
  jpeg = _jpeg(_ramp(375, 500))
  flipped, outs = 0, []
  for i in range(48):
    x = imagenet.train_preprocess(jpeg, _seed(i)).numpy()
    assert x.shape == (224, 224, 3) and x.dtype == np.float32 and np.all(np.isfinite(x))
    left, right = x[:, :112].mean(), x[:, 112:].mean()
    flipped += int(left > right)
    outs.append(x)
  assert 10 <= flipped <= 38, flipped                 # p = 1/2 per image
  assert not np.allclose(outs[0], outs[1])            # crops/colours differ per seed
  np.testing.assert_array_equal(imagenet.train_preprocess(jpeg, _seed(3)).numpy(), outs[3])


def test_random_crop_is_a_224_window_at_the_drawn_scale():
  # Shorter side 256 drawn as 256: no resize, the output is a 224² window of the
  # decoded image (possibly mirrored) at an offset in [0, 32]².
  rng = np.random.default_rng(0)
  image = rng.integers(0, 256, (256, 300, 3), dtype=np.uint8)
  # 4:4:4 chroma: with subsampled chroma, libjpeg's cropped decode upsamples
  # the crop's border differently from a full decode (up to 35/255 on noise).
  jpeg = _jpeg(image, chroma_downsampling=False)
  decoded = tf.io.decode_jpeg(jpeg).numpy().astype(np.float32) / 255
  offsets = set()
  for i in range(6):
    crop = imagenet.random_scale_crop(jpeg, _seed(i), 224, 256, 256).numpy()
    matches = [(y, x) for y in range(33) for x in range(77)
               if np.allclose(decoded[y:y + 224, x:x + 224], crop, atol=1e-5)]
    assert len(matches) == 1, matches
    offsets.add(matches[0])
  assert len(offsets) > 1
  # Shorter side drawn as 512: a 112² window upsampled to 224².
  crop = imagenet.random_scale_crop(jpeg, _seed(0), 224, 512, 512).numpy()
  assert crop.shape == (224, 224, 3)


def _hand_centre_crop(h: int, w: int, slope: tuple[float, float, float]) -> tuple:
  """The eval transform of the image ``v(y, x, c) = a·y + b·x + c·k`` by hand.

  Shorter side to 256 (longer side rounded), centre 224² crop (offsets rounded
  down). Bilinear resampling with half-pixel centres reproduces a linear
  image exactly at ``src = (dst + ½)·in/out − ½`` — also antialiased when the
  scale is exactly 2 (symmetric filter taps).
  """
  a, b, k = slope
  ratio = 256 / min(h, w)
  new_h, new_w = round(h * ratio), round(w * ratio)
  top, left = (new_h - 224) // 2, (new_w - 224) // 2
  ys = (np.arange(224) + top + 0.5) * h / new_h - 0.5
  xs = (np.arange(224) + left + 0.5) * w / new_w - 0.5
  value = a * ys[:, None, None] + b * xs[None, :, None] + k * np.arange(3)[None, None, :]
  return (value / 255 - _MEAN) / _STD, (top, left)


@pytest.mark.parametrize("h,w", [(128, 192), (512, 768)])   # upsampling x2, downsampling /2
def test_eval_centre_crop_matches_hand_computation(h, w):
  slope = (0.3, 0.2, 10.0)
  y, x, c = np.meshgrid(np.arange(h), np.arange(w), np.arange(3), indexing="ij")
  image = (slope[0] * y + slope[1] * x + slope[2] * c).astype(np.float32)
  got = imagenet.eval_preprocess(tf.constant(image)).numpy()
  want, (top, left) = _hand_centre_crop(h, w, slope)
  assert (top, left) == (16, 80)
  assert got.shape == (224, 224, 3)
  np.testing.assert_allclose(got, want, atol=2e-4)


def test_eval_crop_of_a_jpeg_keeps_the_centre():
  # 300x400 resized to 256x341 (x 256/300), centre 224² at (16, 58): in the
  # original that window is rows 18.75..281.25, columns 67.97..330.47. Make
  # just that window white (the rest black): the crop is white, and a crop
  # shifted by a few pixels would not be.
  image = np.zeros((300, 400, 3), np.uint8)
  image[19:281, 68:330] = 255
  x = imagenet.eval_preprocess(tf.io.decode_jpeg(_jpeg(image))).numpy()
  white, black = (1 - _MEAN) / _STD, (0 - _MEAN) / _STD
  np.testing.assert_allclose(x[4:-4, 4:-4].mean((0, 1)), white, atol=0.05)
  for edge in (x[:, :2], x[:, -2:], x[:2], x[-2:]):     # edges half-covered at most
    assert np.all(edge.mean((0, 1)) > (white + black) / 2 - 0.3)


def test_missing_imagenet_explains_the_manual_download(tmp_path):
  with pytest.raises(data.DatasetNotFoundError) as err:
    data.dataset_info("imagenet2012", data_dir=str(tmp_path))
  msg = str(err.value)
  for needle in ("ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar", "image-net.org",
                 f"{tmp_path}/downloads/manual", f"tfds build imagenet2012 --data_dir={tmp_path}"):
    assert needle in msg, needle
  with pytest.raises(FileNotFoundError, match="ILSVRC2012_img_train.tar"):
    data.train_batches("imagenet2012", batch_size=8, seed=0, data_dir=str(tmp_path))
