"""Matrix functions (numpy convention: matrices on the last two axes, batched
over leading axes) and the parameter matrix-view convention."""

from orthojax.linalg._cayley import LowRank
from orthojax.linalg._cayley import cayley_safe_step
from orthojax.linalg._cayley import cayley_transform
from orthojax.linalg._cayley import generator_matmul
from orthojax.linalg._guard import GUARD_SCOPE
from orthojax.linalg._guard import guarded_cond
from orthojax.linalg._matrix_view import Layout
from orthojax.linalg._matrix_view import MatrixView
from orthojax.linalg._matrix_view import check_float
from orthojax.linalg._matrix_view import compute_dtype
from orthojax.linalg._matrix_view import infer_view
from orthojax.linalg._matrix_view import is_view
from orthojax.linalg._matrix_view import layout
from orthojax.linalg._newton_schulz import NS_PRESETS
from orthojax.linalg._newton_schulz import NSPreset
from orthojax.linalg._newton_schulz import newton_schulz
from orthojax.linalg._newton_schulz import newton_schulz_multiply_adds
from orthojax.linalg._polar import polar
from orthojax.linalg._qr import cholesky_qr2
from orthojax.linalg._qr import qr_orthonormalize
from orthojax.linalg._skew import skew
from orthojax.linalg._skew import sym
from orthojax.linalg._tree import BUCKETS
from orthojax.linalg._tree import PADDED_FLOPS
from orthojax.linalg._tree import RecordedViews
from orthojax.linalg._tree import leaf_names
from orthojax.linalg._tree import map_views
from orthojax.linalg._tree import mask_for
from orthojax.linalg._tree import recorded_views
from orthojax.linalg._tree import unzip
from orthojax.linalg._tree import variable_values
from orthojax.linalg._tree import views_for
