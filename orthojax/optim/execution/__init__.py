"""The execution layer: how a per-leaf transformation runs over many devices.

**Owner sharding** (pods, :func:`shard_update`): each matrix has one owner device, which
holds its optimizer state and computes its update; the new values are shared. It is
applied explicitly, like optax's wrappers — ``shard_update(tx, mesh, views=...)`` around
a transformation — and keeps the state users and checkpoints see per leaf
(:func:`replicated_state`). The trainer applies it to the optimizers of
:data:`orthojax.optim.OPTIMIZER_TABLE` (``orthojax.train.optimizers.update_sharding``).
This package sits above the algorithms: it imports them, they never import it.

How one device runs a transformation over many matrices is the transformation's own
``bucket`` keyword (:data:`orthojax.linalg.BUCKETS`: same-shape or zero-padded stacks
updated by one batched program, or one program per leaf); an owner buckets its own
matrices the same way. One module per concept:

* ``owners`` — who owns which matrix (the mesh's owner
  axes, the cost model, the assignment);
* ``layout`` — the plan, :class:`UpdateLayout`, a frozen
  dataclass; ``planning`` builds it (:func:`plan`);
* ``state`` — the sharded state, packed per owner, and its
  conversions to and from the per-leaf state;
* ``sharded`` — :func:`shard_update` itself (with
  ``stripes`` for the stacks striped over the owners).

Why shard. Data parallelism replicates the optimizer: every device computes the whole
orthogonalizing update (projection, transport, retraction, Newton–Schulz) of every
matrix, while its share of the network's work shrinks with the number of devices.
With :func:`shard_update`

1. every matrix (in its matrix view; a scanned stack counts as its layers) has one
   *owner* among the ``N`` devices of the data-parallel mesh axes, chosen to balance
   the update's cost (:func:`assign_owners`);
2. each owner runs the wrapped transformation on its own matrices only, and holds
   their optimizer state only (per-device state ~ 1/N of the replicated one);
3. the owners' new updates are shared by ``all_gather`` s over those axes, one of the
   packed updates per dtype (or, where one owner's row would pad every other's to
   more than twice the updates, by one exact ``psum`` of rows written at their own
   offsets: :func:`plan`); a *striped* stack (owner ``j`` holding layers
   ``[j s, (j + 1) s)``, as :func:`assign_owners` lays out a lone stack), zero-padded
   to ``N s`` layers, enters and leaves as each device's own block of layers instead,
   so that under FSDP the compiler moves it with all-to-alls and no device holds the
   whole stack.

Vectors and scalars (biases, scales, anything without a matrix view) are cheap and
stay replicated: every device updates them, as before.

Split matrices (``split_above``, off by default): one owner per matrix cannot bring
the most loaded device below the largest matrix (ResNet-50's ``1 x 1 x 1024 x 2048``
projection kernel is 19 % of its conv kernels' update cost, 3.1x the mean load on 16
owners). A single matrix above ``split_above`` times the mean owner load (and with an
axis to split, see :func:`plan`) is instead updated by all owners together: its
gradient, parameter and param-shaped state are constrained to have the matrix view's
long side (its rows) split over the owner axes, and the compiler (GSPMD) partitions
the wrapped transformation's products. Each owner then
does ``1/N`` of the ``n``-long work and repeats the ``p x p`` work; the price is an
all-reduce of a ``p x p`` partial product (a Gram matrix) per contracted product,
*inside* the Newton–Schulz / Cayley iterations — the very collectives whole-matrix
ownership avoids (goodfire-ai/spd measured a 3.3x step-time loss when every matrix
was split that way), which is why it is opt-in and meant for the few largest
matrices only. Split along the long side, such a matrix is never gathered by the
update: the row-local maps the compiler cannot see through (CholeskyQR's triangular
solve) state their row locality (``orthojax.linalg._rows``). Maps that are not row-local
do gather it: an SVD (the "polar" retraction; "newton_schulz" or "qr" stay split), and
Householder QR, CholeskyQR2's rare fall-back.

Execution: see ``orthojax.optim.execution.sharded``. No collective runs inside an
orthogonalization: the only collectives the wrapper adds are the all-gathers (or the
sum) of the finished updates. Dion (microsoft/dion) shares same-shape stacks with all-to-alls;
here whole matrices of any shape are assigned, which is what ResNet-style kernels with
many distinct shapes need.

Exactness: an owner computes its matrices with the same operations as the replicated
update computes them (a stack is sliced along its batch axis, which batched matrix
products treat independently), so the sharded step equals the replicated one to float
rounding: within a few ulps in float32 on XLA:CPU, not bit for bit, because XLA fuses
the element-wise work of the per-device program differently.

Requirement on the wrapped transformation: it must be *per leaf* — a leaf's update
depends on that leaf's gradient, parameter and state only (plus shared counters such
as a step count). Every orthojax optimizer and optax's element-wise ones are; a
global-norm clip or a penalty summed over leaves is not, and must stay outside the
wrapper.
"""

from orthojax.optim.execution.layout import OwnerState
from orthojax.optim.execution.layout import Role
from orthojax.optim.execution.layout import Slot
from orthojax.optim.execution.layout import SplitMatrix
from orthojax.optim.execution.layout import UpdateLayout
from orthojax.optim.execution.owners import MatrixLeaf
from orthojax.optim.execution.owners import Piece
from orthojax.optim.execution.owners import assign_owners
from orthojax.optim.execution.owners import num_owners
from orthojax.optim.execution.owners import owner_axes
from orthojax.optim.execution.owners import split_cost
from orthojax.optim.execution.owners import split_matrices
from orthojax.optim.execution.planning import plan
from orthojax.optim.execution.sharded import shard_update
from orthojax.optim.execution.state import ShardedUpdateState
from orthojax.optim.execution.state import replicated_state
from orthojax.optim.execution.state import sharded_state
