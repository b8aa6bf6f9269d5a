"""UCI regression sets (E3; GmP Table 3): 10 random 80/20 splits, standardised.

Names ``uci/boston``, ``uci/concrete``, ``uci/energy``, ``uci/power``,
``uci/wine``, ``uci/yacht``. Where the data comes from, first match wins:

1. ``csv_path=`` — a numeric table (comma, semicolon or whitespace
   separated; header lines before the first numeric row are skipped) in
   either layout: the feature columns then the target (``features + 1``
   columns), or the original UCI file's columns (:data:`SPECS` says which
   column is the target; Energy's second target, cooling load, is dropped).
2. ``<data_dir>/uci/<name>.csv`` — the cache (``data_dir`` defaults to
   ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``), features then target.
3. Bundled: Boston housing ships with mlxtend
   (``mlxtend.data.boston_housing_data()``, the 506 × 13 original). Neither
   mlxtend nor scikit-learn bundle the other five.
4. ``download=True`` (default): fetched from the UCI archive URL in
   :data:`SPECS` and cached as in 2 (the Excel files of Concrete, Energy and
   Power need pandas with ``xlrd`` / ``openpyxl``).

Otherwise a :class:`DatasetNotFoundError` names the file to provide, its
expected layout and the URL.

Splits. Split ``split_index`` ∈ {0, …, 9} orders the rows by
``np.random.default_rng(split_index).permutation(n)``; the last
``round(test_fraction·n)`` rows (20 %) are ``test``; of the rest, the last
``round(validation_fraction·m)`` are ``validation`` (honest protocol:
early stopping and learning-rate plateaus watch ``validation``; default
0.2) and the others ``train``. ``validation_fraction=0`` gives the released
GmP protocol's split (all 80 % train; its early stopping on ``test`` is the
trainer's business). ``eval`` means ``validation`` when there is one, else
``test``.

Standardisation: ``x`` per feature and ``y`` (``standardize_y=True``) with
the mean and standard deviation (ddof 0; a zero std becomes 1) of the
``train`` split only; ``DatasetInfo.target_std`` converts errors back to the
original units. ``x``: float32 ``(features,)``; ``y``: float32 scalar.
Full-batch training: ``batch_size=-1``.

References:
  Hernández-Lobato & Adams, "Probabilistic Backpropagation for Scalable
  Learning of Bayesian Neural Networks", ICML 2015 (the 10/20-split protocol).
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import urllib.request
import zipfile
from typing import Iterator

import numpy as np

from orthojax.train.data import _arrays
from orthojax.train.data._info import DatasetInfo
from orthojax.train.data._info import DatasetNotFoundError

NUM_SPLITS = 10
SPLITS = ("train", "validation", "test")
_UCI = "https://archive.ics.uci.edu/ml/machine-learning-databases"


@dataclasses.dataclass(frozen=True)
class UciSpec:
  """One UCI set: its size, column layout and source.

  Attributes:
    rows: rows in the original file.
    features: number of input features.
    raw_columns: columns of the original file.
    target_column: the target's column in the original file.
    drop_columns: other non-feature columns of the original file.
    layout: the columns in words.
    url: the UCI archive file ("" = none; Boston is bundled with mlxtend).
    fmt: ``"text"``, ``"xls"``, ``"xlsx"`` or ``"zip-xlsx"``.
  """

  rows: int
  features: int
  raw_columns: int
  target_column: int
  drop_columns: tuple[int, ...]
  layout: str
  url: str
  fmt: str


SPECS: dict[str, UciSpec] = {
    "boston": UciSpec(
        506, 13, 14, 13, (),
        "CRIM, ZN, INDUS, CHAS, NOX, RM, AGE, DIS, RAD, TAX, PTRATIO, B, LSTAT, then MEDV "
        "(median home value, $1000s)", "", "text"),
    "concrete": UciSpec(
        1030, 8, 9, 8, (),
        "cement, blast furnace slag, fly ash, water, superplasticizer, coarse aggregate, "
        "fine aggregate, age, then compressive strength (MPa)",
        f"{_UCI}/concrete/compressive/Concrete_Data.xls", "xls"),
    "energy": UciSpec(
        768, 8, 10, 8, (9,),
        "X1..X8 (relative compactness, surface area, wall area, roof area, overall height, "
        "orientation, glazing area, glazing area distribution), then Y1 heating load "
        "(the target; a 10th column Y2 cooling load is dropped)",
        f"{_UCI}/00242/ENB2012_data.xlsx", "xlsx"),
    "power": UciSpec(
        9568, 4, 5, 4, (),
        "AT (temperature), V (exhaust vacuum), AP (ambient pressure), RH (relative humidity), "
        "then PE (net electrical energy output, MW)",
        f"{_UCI}/00294/CCPP.zip", "zip-xlsx"),
    "wine": UciSpec(
        1599, 11, 12, 11, (),
        "the 11 physicochemical columns of winequality-red.csv, then quality",
        f"{_UCI}/wine-quality/winequality-red.csv", "text"),
    "yacht": UciSpec(
        308, 6, 7, 6, (),
        "centre of buoyancy position, prismatic coefficient, length-displacement ratio, "
        "beam-draught ratio, length-beam ratio, Froude number, then residuary resistance",
        f"{_UCI}/00243/yacht_hydrodynamics.data", "text"),
}
NAMES = tuple(f"uci/{k}" for k in SPECS)


def check_options(opts: dict) -> None:
  if not 0 <= opts["split_index"] < NUM_SPLITS:
    raise ValueError(f"uci: split_index={opts['split_index']}: must be in 0..{NUM_SPLITS - 1}")
  if not 0.0 < opts["test_fraction"] < 1.0:
    raise ValueError(f"uci: test_fraction={opts['test_fraction']}: must be in (0, 1)")
  if not 0.0 <= opts["validation_fraction"] < 1.0:
    raise ValueError(f"uci: validation_fraction={opts['validation_fraction']}: "
                     f"must be in [0, 1)")


# ------------------------------------------------------------------ Files --

def read_table(text: str, source: str = "<text>") -> np.ndarray:
  """A numeric table from text; header lines before the first numeric row are skipped."""
  rows: list[list[float]] = []
  for line_no, line in enumerate(text.splitlines(), 1):
    tokens = [t for t in re.split(r"[,;\s]+", line.strip()) if t]
    if not tokens:
      continue
    try:
      rows.append([float(t) for t in tokens])
    except ValueError:
      if rows:
        raise ValueError(f"{source}:{line_no}: non-numeric value in {line.strip()[:80]!r}")
  if not rows:
    raise ValueError(f"{source}: no numeric rows")
  widths = {len(r) for r in rows}
  if len(widths) != 1:
    raise ValueError(f"{source}: rows have different numbers of columns {sorted(widths)}")
  return np.asarray(rows, np.float64)


def _features_target(table: np.ndarray, spec: UciSpec, name: str,
                     source: str) -> tuple[np.ndarray, np.ndarray]:
  cols = table.shape[1]
  if cols == spec.features + 1:
    return table[:, :-1], table[:, -1]
  if cols == spec.raw_columns:
    keep = [c for c in range(cols) if c != spec.target_column and c not in spec.drop_columns]
    return table[:, keep], table[:, spec.target_column]
  raise ValueError(f"uci/{name}: {source} has {cols} columns; expected {spec.features + 1} "
                   f"(features then target) or {spec.raw_columns} (the original file): "
                   f"{spec.layout}")


def cache_path(name: str, data_dir: str | None) -> str:
  root = data_dir or os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")
  return os.path.join(root, "uci", f"{name}.csv")


def _missing(name: str, spec: UciSpec, data_dir: str | None, why: str) -> DatasetNotFoundError:
  where = f" or download {spec.url} and convert it" if spec.url else ""
  return DatasetNotFoundError(
      f"uci/{name}: {why}. Provide the data as csv_path=/path/to/{name}.csv "
      f"(config.data.csv_path=...), or save it as {cache_path(name, data_dir)}{where}. "
      f"Expected about {spec.rows} rows of {spec.features} feature columns then the target: "
      f"{spec.layout}; comma/semicolon/whitespace separated, optional header line.")


def _download(name: str, spec: UciSpec, dest: str) -> np.ndarray:
  with urllib.request.urlopen(spec.url, timeout=60) as response:
    payload = response.read()
  if spec.fmt == "text":
    table = read_table(payload.decode("utf-8", "replace"), spec.url)
  else:
    import pandas as pd  # Excel readers need xlrd (xls) / openpyxl (xlsx)
    if spec.fmt == "zip-xlsx":
      with zipfile.ZipFile(io.BytesIO(payload)) as zf:
        member = next(m for m in zf.namelist() if m.endswith(".xlsx"))
        payload = zf.read(member)
    frame = pd.read_excel(io.BytesIO(payload), sheet_name=0)
    table = frame.dropna(how="all").dropna(axis=1, how="all").to_numpy(np.float64)
  x, y = _features_target(table, spec, name, spec.url)
  os.makedirs(os.path.dirname(dest), exist_ok=True)
  tmp = f"{dest}.tmp{os.getpid()}"
  np.savetxt(tmp, np.column_stack([x, y]), delimiter=",", fmt="%.10g")
  os.replace(tmp, dest)  # atomic: concurrent processes never read half a file
  return table


def load(name: str, opts: dict, data_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
  """All rows of ``uci/<name>`` as ``(x (n, features), y (n,))`` float64 (see module doc)."""
  spec = SPECS[name]
  path = opts["csv_path"]
  if path:
    if not os.path.isfile(path):
      raise _missing(name, spec, data_dir, f"csv_path={path} does not exist")
  elif os.path.isfile(cache_path(name, data_dir)):
    path = cache_path(name, data_dir)
  elif name == "boston":
    try:
      from mlxtend.data import boston_housing_data
    except ImportError as e:
      raise _missing(name, spec, data_dir, "mlxtend (which bundles it) is not installed") from e
    x, y = boston_housing_data()
    return np.asarray(x, np.float64), np.asarray(y, np.float64)
  elif opts["download"]:
    try:
      _download(name, spec, cache_path(name, data_dir))
    except Exception as e:  # offline, no Excel reader, moved URL, ...
      raise _missing(name, spec, data_dir,
                     f"no local file, and downloading {spec.url} failed "
                     f"({type(e).__name__}: {e})") from e
    path = cache_path(name, data_dir)
  else:
    raise _missing(name, spec, data_dir, "no local file (and download=False)")
  with open(path) as f:
    table = read_table(f.read(), path)
  return _features_target(table, spec, name, path)


# ----------------------------------------------------------------- Splits --

def split_indices(n: int, split_index: int, test_fraction: float = 0.2,
                  validation_fraction: float = 0.2) -> dict[str, np.ndarray]:
  """Row indices of ``train`` / ``validation`` / ``test`` for split ``split_index``."""
  order = np.random.default_rng(split_index).permutation(n)
  n_rest = n - int(round(test_fraction * n))
  n_val = int(round(validation_fraction * n_rest))
  return {"train": order[:n_rest - n_val], "validation": order[n_rest - n_val:n_rest],
          "test": order[n_rest:]}


def _standardise(x: np.ndarray, train: np.ndarray) -> tuple[np.ndarray, float, float]:
  mean, std = x[train].mean(0), x[train].std(0)
  std = np.where(std > 1e-12, std, 1.0)
  return (x - mean) / std, mean, std


def prepared(name: str, opts: dict, data_dir: str | None
             ) -> tuple[dict[str, dict[str, np.ndarray]], float | None, float | None]:
  """``({split: {"x", "y"}}, target_mean, target_std)`` — split and standardised."""
  check_options(opts)
  x, y = load(name, opts, data_dir)
  idx = split_indices(len(x), opts["split_index"], opts["test_fraction"],
                      opts["validation_fraction"])
  x, _, _ = _standardise(x, idx["train"])
  y_mean = y_std = None
  if opts["standardize_y"]:
    y, y_mean, y_std = _standardise(y, idx["train"])
    y_mean, y_std = float(y_mean), float(y_std)
  splits = {k: {"x": x[i].astype(np.float32), "y": y[i].astype(np.float32)}
            for k, i in idx.items()}
  return splits, y_mean, y_std


def _short(name: str) -> str:
  return name.split("/", 1)[1]


def _eval_split(split: str, splits: dict) -> str:
  if split == "eval":
    return "validation" if len(splits["validation"]["y"]) else "test"
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; choose one of {('eval',) + SPLITS}")
  if not len(splits[split]["y"]):
    raise ValueError(f"split {split!r} is empty (validation_fraction=0?)")
  return split


def info(name: str, opts: dict, data_dir: str | None) -> DatasetInfo:
  splits, y_mean, y_std = prepared(_short(name), opts, data_dir)
  eval_split = _eval_split("eval", splits)
  return DatasetInfo(name=name, task="regression", input_shape=splits["train"]["x"].shape[1:],
                     num_classes=None, num_train=len(splits["train"]["y"]),
                     num_eval=len(splits[eval_split]["y"]), eval_split=eval_split,
                     target_mean=y_mean, target_std=y_std)


def train_batches(name: str, opts: dict, *, batch_size: int | None, seed: int,
                  start_batch: int, data_dir: str | None, process_index: int,
                  process_count: int) -> Iterator[dict[str, np.ndarray]]:
  splits, _, _ = prepared(_short(name), opts, data_dir)
  return _arrays.train_batches(splits["train"], batch_size=batch_size, seed=seed,
                               start_batch=start_batch, process_index=process_index,
                               process_count=process_count)


def eval_batches(name: str, opts: dict, *, split: str, batch_size: int | None,
                 data_dir: str | None, process_index: int, process_count: int
                 ) -> Iterator[dict[str, np.ndarray]]:
  splits, _, _ = prepared(_short(name), opts, data_dir)
  return _arrays.eval_batches(splits[_eval_split(split, splits)], batch_size=batch_size,
                              process_index=process_index, process_count=process_count)
