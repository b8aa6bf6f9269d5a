"""Tests for the matrix-view convention (orthojax.linalg._matrix_view).

References are plain numpy transposes / reshapes written out per case, so a
wrong axis order, a wrong tall/wide decision or a lossy round trip fails.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax.contrib
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orthojax import linalg
from orthojax.linalg import MatrixView


def _arange(shape):
  return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


# (shape, view, expected batch_shape, fan_in, fan_out, numpy tall reference)
_CASES = {
    "dense": ((5, 3), None, (), 5, 3, lambda x: x),
    "dense_wide": ((3, 5), None, (), 3, 5, lambda x: x.T),
    "dense_square": ((4, 4), None, (), 4, 4, lambda x: x),
    "conv2d": ((3, 3, 2, 4), None, (), 18, 4, lambda x: x.reshape(-1, 4)),
    "conv2d_wide": ((1, 1, 4, 16), None, (), 4, 16, lambda x: x.reshape(4, 16).T),
    "stacked": ((6, 5, 3), MatrixView.stacked(), (6,), 5, 3, lambda x: x),
    "stacked_wide": ((6, 3, 5), MatrixView.stacked(), (6,), 3, 5,
                     lambda x: np.swapaxes(x, -1, -2)),
    "stacked2": ((2, 3, 5, 4), MatrixView.stacked(num_batch_axes=2), (2, 3), 5, 4, lambda x: x),
    "conv1d": ((3, 2, 4), MatrixView.conv(1), (), 6, 4, lambda x: x.reshape(6, 4)),
    "stacked_conv1d": ((2, 3, 2, 5), MatrixView.stacked(MatrixView.conv(1)), (2,), 6, 5,
                       lambda x: x.reshape(2, 6, 5)),
    "explicit_conv2d": ((2, 2, 3, 4), MatrixView(reduction_axis=(0, 1, 2), output_axis=3), (),
                        12, 4, lambda x: x.reshape(12, 4)),
    # torch-style (out, in) kernel through negative axes: fan-in is the last axis.
    "out_in_negative": ((3, 7), MatrixView(reduction_axis=-1, output_axis=-2), (), 7, 3,
                        lambda x: x.T),
    # batch axis in the middle: (in, L, out).
    "middle_batch": ((5, 2, 3), MatrixView(reduction_axis=0, output_axis=-1), (2,), 5, 3,
                     lambda x: np.transpose(x, (1, 0, 2))),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_layout_cases(case):
  shape, view, batch, fan_in, fan_out, ref = _CASES[case]
  lo = linalg.layout(shape, view)
  assert lo.shape == shape
  assert lo.batch_shape == batch
  assert (lo.fan_in, lo.fan_out) == (fan_in, fan_out)
  assert lo.transposed == (fan_in < fan_out)
  assert (lo.n, lo.p) == (max(fan_in, fan_out), min(fan_in, fan_out))
  x = _arange(shape)
  tall = np.asarray(lo.to_tall(jnp.asarray(x)))
  np.testing.assert_array_equal(tall, ref(x))
  assert tall.shape == batch + (lo.n, lo.p)
  np.testing.assert_array_equal(np.asarray(lo.from_tall(jnp.asarray(tall))), x)
  m = np.asarray(lo.to_matrix(jnp.asarray(x)))
  assert m.shape == batch + (fan_in, fan_out)
  np.testing.assert_array_equal(m, np.swapaxes(tall, -1, -2) if lo.transposed else tall)
  np.testing.assert_array_equal(np.asarray(lo.from_matrix(jnp.asarray(m))), x)


def test_conv_tall_is_reshape_and_transpose_when_wide():
  rng = np.random.default_rng(0)
  k = rng.standard_normal((3, 3, 4, 8)).astype(np.float32)
  np.testing.assert_array_equal(linalg.layout(k.shape).to_tall(k), k.reshape(-1, 8))
  k = rng.standard_normal((1, 1, 4, 16)).astype(np.float32)
  np.testing.assert_array_equal(linalg.layout(k.shape).to_tall(k), k.reshape(-1, 16).T)
  # (9 cin, cout) entry order: row index = (kh * 3 + kw) * cin + ci.
  k = _arange((3, 3, 2, 5))
  tall = np.asarray(linalg.layout(k.shape).to_tall(k))
  assert tall[(2 * 3 + 1) * 2 + 1, 4] == k[2, 1, 1, 4]


def test_infer_view_defaults():
  assert linalg.infer_view((4, 5)) == MatrixView.dense()
  assert linalg.infer_view((3, 3, 4, 5)) == MatrixView.conv(2)
  assert linalg.layout((3, 3, 4, 5)) == linalg.layout((3, 3, 4, 5), MatrixView.conv(2))
  assert linalg.layout((4, 5)) == linalg.layout((4, 5), MatrixView(0, 1))


@pytest.mark.parametrize("shape,muon,view", [
    ((3, 3, 4, 8), optax.contrib.MuonDimensionNumbers((0, 1, 2), 3), MatrixView.conv(2)),
    ((6, 5, 3), optax.contrib.MuonDimensionNumbers(1, 2), MatrixView.stacked()),
    ((6, 5, 3), optax.contrib.MuonDimensionNumbers(-2, -1), MatrixView.stacked()),
    ((3, 7), optax.contrib.MuonDimensionNumbers(1, 0),
     MatrixView(reduction_axis=-1, output_axis=-2)),
    ((4, 5), optax.contrib.MuonDimensionNumbers(), MatrixView.dense()),
])
def test_muon_dimension_numbers_same_meaning(shape, muon, view):
  assert linalg.is_view(muon)
  lo_muon, lo_view = linalg.layout(shape, muon), linalg.layout(shape, view)
  assert lo_muon == lo_view
  x = _arange(shape)
  np.testing.assert_array_equal(lo_muon.to_tall(x), lo_view.to_tall(x))


def test_is_view():
  assert linalg.is_view(MatrixView())
  assert linalg.is_view(optax.contrib.MuonDimensionNumbers())
  assert not linalg.is_view((0, 1))
  assert not linalg.is_view("dense")
  assert not linalg.is_view(None)


def test_stacked_and_conv_constructors():
  # Compared through their layouts: (-2,) and -2 mean the same axis.
  same = lambda shape, a, b: linalg.layout(shape, a) == linalg.layout(shape, b)
  assert same((6, 5, 3), MatrixView.stacked(), MatrixView(1, 2))
  assert same((3, 4, 5), MatrixView.conv(1), MatrixView((0, 1), 2))
  assert same((2, 3, 3, 4, 5), MatrixView.stacked(MatrixView.conv(2)), MatrixView((1, 2, 3), 4))
  assert same((2, 3, 4, 5), MatrixView.stacked(MatrixView(0, 1), num_batch_axes=2),
              MatrixView(2, 3))
  assert not same((3, 4, 5), MatrixView.conv(1), MatrixView.stacked())
  with pytest.raises(ValueError, match="spatial_dims"):
    MatrixView.conv(0)


@st.composite
def _random_views(draw):
  """A shape of rank 2..5 and a random split of its axes into batch/fan-in/fan-out."""
  ndim = draw(st.integers(2, 5))
  shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
  perm = draw(st.permutations(range(ndim)))
  n_red = draw(st.integers(1, ndim - 1))
  n_out = draw(st.integers(1, ndim - n_red))
  red = list(perm[:n_red])
  out = list(perm[n_red:n_red + n_out])
  # Randomly write some axes as negative indices.
  negate = draw(st.lists(st.booleans(), min_size=ndim, max_size=ndim))
  red_w = tuple(a - ndim if negate[a] else a for a in red)
  out_w = tuple(a - ndim if negate[a] else a for a in out)
  as_int = draw(st.booleans())
  view = MatrixView(red_w[0] if as_int and len(red_w) == 1 else red_w,
                    out_w[0] if as_int and len(out_w) == 1 else out_w)
  return shape, view, red, out


@given(_random_views(), st.integers(0, 2**31 - 1))
def test_round_trips_random_views(spec, seed):
  shape, view, red, out = spec
  x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  lo = linalg.layout(shape, view, name="w")
  batch = [a for a in range(len(shape)) if a not in red and a not in out]
  fan_in = int(np.prod([shape[a] for a in red]))
  fan_out = int(np.prod([shape[a] for a in out]))
  bshape = tuple(shape[a] for a in batch)
  # Independent reference: numpy transpose to (batch, fan-in, fan-out) in the
  # order the axes were given, then reshape.
  ref_m = np.transpose(x, batch + red + out).reshape(bshape + (fan_in, fan_out))
  ref_t = np.swapaxes(ref_m, -1, -2) if fan_in < fan_out else ref_m
  assert lo.batch_shape == bshape and (lo.fan_in, lo.fan_out) == (fan_in, fan_out)
  m = lo.to_matrix(jnp.asarray(x))
  t = lo.to_tall(jnp.asarray(x))
  np.testing.assert_array_equal(m, ref_m)
  np.testing.assert_array_equal(t, ref_t)
  assert t.shape[-2] >= t.shape[-1]
  np.testing.assert_array_equal(lo.from_matrix(m), x)
  np.testing.assert_array_equal(lo.from_tall(t), x)
  # The other direction: any tall array maps back and forth exactly.
  y = np.random.default_rng(seed + 1).standard_normal(ref_t.shape).astype(np.float32)
  np.testing.assert_array_equal(lo.to_tall(lo.from_tall(jnp.asarray(y))), y)
  assert lo.from_tall(jnp.asarray(y)).shape == shape


@pytest.mark.parametrize("shape", [(5,), ()])
def test_rank_below_two_names_parameter(shape):
  with pytest.raises(ValueError, match="encoder/bias"):
    linalg.layout(shape, name="encoder/bias")
  with pytest.raises(ValueError, match="encoder/bias"):
    linalg.layout(shape, MatrixView(), name="encoder/bias")
  with pytest.raises(ValueError, match="encoder/bias"):
    linalg.infer_view(shape, name="encoder/bias")


@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 3, 4, 5, 6)])
def test_ambiguous_rank_needs_view(shape):
  with pytest.raises(ValueError, match=r"(?s)layers/kernel.*ambiguous.*MatrixView\.stacked"):
    linalg.layout(shape, name="layers/kernel")


@pytest.mark.parametrize("shape,view", [
    ((4, 5), MatrixView(0, 0)),
    ((4, 5), MatrixView(1, -1)),  # same axis written two ways
    ((3, 4, 5), MatrixView((0, 1), 1)),
    ((3, 4, 5), MatrixView((0, 0), 2)),
    ((3, 4, 5), MatrixView((0, -3), 2)),
])
def test_overlapping_axes_raise(shape, view):
  with pytest.raises(ValueError, match="w1"):
    linalg.layout(shape, view, name="w1")


@pytest.mark.parametrize("view", [MatrixView(0, 2), MatrixView(-3, 1), MatrixView((0, 5), 1)])
def test_out_of_range_axes_raise(view):
  with pytest.raises(ValueError, match="out of range"):
    linalg.layout((4, 5), view, name="w")


def test_empty_axes_raise():
  with pytest.raises(ValueError, match="w"):
    linalg.layout((4, 5), MatrixView((), 1), name="w")


@pytest.mark.parametrize("view", [(0, 1), "dense", [0, 1], 3])
def test_non_view_object_is_type_error(view):
  with pytest.raises(TypeError, match="head/kernel"):
    linalg.layout((4, 5), view, name="head/kernel")


def test_to_matrix_wrong_shape_raises():
  lo = linalg.layout((4, 5))
  with pytest.raises(ValueError, match="does not match"):
    lo.to_tall(jnp.zeros((5, 4)))


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint8, jnp.bool_])
def test_check_float_rejects_non_float(dtype):
  with pytest.raises(TypeError, match="dense_1/kernel"):
    linalg.check_float(jnp.zeros((3, 3), dtype), name="dense_1/kernel")
  with pytest.raises(TypeError, match="p"):
    linalg.check_float(np.zeros((2, 2), dtype), name="p")


def test_check_float_rejects_python_ints():
  with pytest.raises(TypeError, match="lst"):
    linalg.check_float([[1, 2], [3, 4]], name="lst")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16, np.float64])
def test_check_float_accepts_floats(dtype):
  linalg.check_float(np.zeros((2, 2), dtype=dtype), name="x")  # no raise


@pytest.mark.parametrize("dtype,expected", [
    (jnp.bfloat16, jnp.float32),
    (jnp.float16, jnp.float32),
    (jnp.float32, jnp.float32),
    (jnp.float64, jnp.float64),
])
def test_compute_dtype(dtype, expected):
  assert jnp.dtype(linalg.compute_dtype(dtype)) == jnp.dtype(expected)


def test_row_blocks_travel_with_the_view_into_its_layout_and_stack():
  """A view's ``row_blocks`` (rows split over devices) reaches its layout, survives
  ``stacked`` and makes a different layout (bucketing keeps split matrices apart); optax's
  dimension numbers are whole matrices."""
  split = MatrixView.conv(2)._replace(row_blocks=8)
  assert linalg.layout((3, 3, 16, 8), split).row_blocks == 8
  assert linalg.layout((3, 3, 16, 8), MatrixView.conv(2)).row_blocks == 1
  assert MatrixView.stacked(split).row_blocks == 8
  assert linalg.layout((3, 3, 16, 8), split) != linalg.layout((3, 3, 16, 8), MatrixView.conv(2))
  dims = optax.contrib.MuonDimensionNumbers(0, 1)
  assert linalg.layout((4, 5), dims).row_blocks == 1


@pytest.mark.parametrize("blocks", [0, -1, 2.0, True])
def test_row_blocks_must_be_a_positive_int(blocks):
  with pytest.raises(ValueError, match=r"w: view .* row_blocks"):
    linalg.layout((4, 5), MatrixView(0, 1, row_blocks=blocks), name="w")
