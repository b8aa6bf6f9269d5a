"""Riemannian manifolds (Stiefel, Oblique) over parameters in their matrix view.

Every method takes parameters in their own layout plus an optional ``view``
(:class:`orthojax.linalg.MatrixView`); the maths runs on the tall matrix
``(*batch, n, p)``, n >= p, in at least float32.
"""

from orthojax.manifolds._base import Manifold
from orthojax.manifolds._oblique import Oblique
from orthojax.manifolds._stiefel import Stiefel
from orthojax.manifolds._stiefel import cayley_generator
from orthojax.manifolds._stiefel import corrected_newton_schulz_step
from orthojax.manifolds._stiefel import polish
from orthojax.manifolds._stiefel import newton_schulz_step
from orthojax.manifolds._stiefel import reorthonormalize_newton_schulz
