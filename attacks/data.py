"""Datasets for adversarial training and evaluation (the ``--data`` of the command line).

:func:`load_dataset` accepts ``digits`` (embedded: scikit-learn's 8x8 digits through
:func:`robustgrad.data.load_digits`), ``mnist``, ``fashion_mnist``, ``cifar10`` (through
``keras.datasets``, only when the archive is already on disk: nothing is downloaded) or a path to an
``.npz`` file holding ``x_train, y_train, x_test, y_test`` (and optionally ``num_classes``: the
classes are the declared ones, else the test set's; a training label outside them is an error).
:func:`load_test_set` also accepts an
``.npz`` holding only an evaluation set (``x_test, y_test`` or ``x, y``).

Images come back as float32 NHWC (``[N, H, W, C]``; a channel axis is added to ``[N, H, W]``
arrays) in ``[0, 1]``; ``.npz`` files keep their own value range, reported as
``clip_min``/``clip_max``. Labels come back as int64 of shape ``[N]``. Every problem with a file
(not a zip archive, truncated, missing arrays, strings, empty arrays, NaN, labels that are not
class indices) is a ``ValueError`` (``FileNotFoundError`` for a missing file) naming the file and
what is wrong, raised before any training or evaluation starts.

Example:
  >>> ds = load_dataset("digits")
  >>> ds.x_train.shape, ds.x_test.dtype.name, ds.num_classes, (ds.clip_min, ds.clip_max)
  ((1347, 8, 8, 1), 'float32', 10, (0.0, 1.0))
  >>> load_dataset("imagenet")  # doctest: +ELLIPSIS
  Traceback (most recent call last):
  ...
  ValueError: unknown dataset 'imagenet': expected one of digits, mnist, ... or a path ending in .npz
"""

from __future__ import annotations

import dataclasses
import os
import zipfile

import numpy as np

__all__ = ["DATASETS", "Dataset", "load_dataset", "load_test_set"]

DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10")

# keras.datasets archive each loader looks for under ~/.keras/datasets (KERAS_HOME respected).
_KERAS_FILES = {
    "mnist": ("mnist.npz",),
    "fashion_mnist": (
        "fashion-mnist/train-labels-idx1-ubyte.gz",
        "fashion-mnist/train-images-idx3-ubyte.gz",
        "fashion-mnist/t10k-labels-idx1-ubyte.gz",
        "fashion-mnist/t10k-images-idx3-ubyte.gz",
    ),
    "cifar10": ("cifar-10-batches-py/data_batch_1",),
}

_SPLIT_KEYS = ("x_train", "y_train", "x_test", "y_test")


@dataclasses.dataclass
class Dataset:
    """Arrays of one dataset and the value range its pixels live in.

    ``x_*`` are float32 ``[N, H, W, C]``, ``y_*`` int64 ``[N]``.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    clip_min: float
    clip_max: float

    declared_classes: int | None = None
    """The ``num_classes`` an ``.npz`` file declares (``None``: not declared)."""

    @property
    def num_classes(self) -> int:
        """The declared number of classes, else one more than the largest label of either
        split (an ``.npz`` whose ``y_train`` strays beyond its test classes is refused)."""
        if self.declared_classes is not None:
            return self.declared_classes
        return int(max(self.y_train.max(), self.y_test.max())) + 1

    @property
    def input_shape(self) -> tuple:
        """The shape of one example, e.g. ``(8, 8, 1)``."""
        return tuple(self.x_train.shape[1:])


def _keras_home() -> str:
    base = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return os.path.join(base, "datasets")


def _check_split(name: str, x: np.ndarray, y: np.ndarray, kx: str, ky: str) -> None:
    """``ValueError`` naming the file and the array unless ``x``/``y`` (called ``kx``/``ky`` in
    the file) are a usable split."""
    for key, arr in ((kx, x), (ky, y)):
        if arr.dtype.kind not in "biuf":
            raise ValueError(f"data {name!r}: {key} must hold numbers, got dtype {arr.dtype}")
        if arr.size == 0:
            raise ValueError(f"data {name!r}: {key} is empty (shape {arr.shape})")
    if x.ndim < 2 or len(x) != len(y):
        raise ValueError(f"data {name!r}: {kx} has shape {x.shape} but {ky} has {len(y)} labels")
    if y.ndim != 1 and not (y.ndim == 2 and y.shape[1] == 1):
        raise ValueError(f"data {name!r}: {ky} must be integer class labels of shape (N,), "
                         f"got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) and not np.all(np.equal(np.mod(y, 1), 0)):
        raise ValueError(f"data {name!r}: {ky} must hold integer class labels")
    if (y < 0).any():
        raise ValueError(f"data {name!r}: {ky} holds negative labels")
    if not np.isfinite(x).all():
        raise ValueError(f"data {name!r}: {kx} holds NaN or infinite values")


def _check_labels(name: str, y_train: np.ndarray, y_test: np.ndarray,
                  declared: np.ndarray | None) -> int | None:
    """The number of classes of an ``.npz`` dataset, by one rule: the file's ``num_classes``
    when it declares one, else the test set's (its largest label + 1). A label outside that
    range (a stray ``y_train`` of 12 with 10 test classes) is a ``ValueError`` naming the file,
    the array and the label, never a silently larger model. Returns the declared count."""
    where = "the num_classes the file declares"
    if declared is not None:
        if declared.size != 1 or declared.dtype.kind not in "iu" or int(declared) < 1:
            raise ValueError(f"--data {name}: num_classes must be one integer >= 1, got "
                             f"{declared.tolist()!r}")
        count = int(declared)
    else:
        count, where = int(y_test.max()) + 1, "the classes of y_test"
    for key, y in (("y_train", y_train), ("y_test", y_test)):
        stray = np.unique(y[y >= count])
        if stray.size:
            shown = ", ".join(str(int(v)) for v in stray[:5]) + (" ..." if stray.size > 5 else "")
            raise ValueError(f"--data {name}: {key} holds label {shown}, outside {where} "
                             f"(labels 0-{count - 1}); fix the labels, or declare num_classes "
                             "in the file when the test set lacks some classes")
    return None if declared is None else count


def _read_npz(path: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file, with one clear error for a file that is not one."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"--data {path}: no such file")
    if os.path.isdir(path):
        raise ValueError(f"--data {path}: is a directory, expected an .npz file")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"--data {path}: not an .npz file (not a zip archive, or truncated)")
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: np.asarray(f[k]) for k in f.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"--data {path}: unreadable .npz file ({exc})") from None


def _images(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return x[..., None] if x.ndim == 3 else x


def _value_range(*arrays: np.ndarray) -> tuple[float, float]:
    lo = float(min(a.min() for a in arrays))
    hi = float(max(a.max() for a in arrays))
    return (0.0, 1.0) if lo >= 0.0 and hi <= 1.0 else (lo, hi)


def load_dataset(name: str, *, seed: int = 0) -> Dataset:
    """Load a dataset by name or ``.npz`` path; every problem raises before any work.

    Args:
        name: one of :data:`DATASETS` or a path ending in ``.npz``.
        seed: the train/test split of ``digits`` (the other datasets come split).

    Raises:
        FileNotFoundError: a missing ``.npz`` file or ``keras.datasets`` archive.
        ValueError: an unknown name or a file that does not hold a usable dataset.
    """
    if not isinstance(name, str):
        raise TypeError(f"data must be a dataset name or an .npz path, got {name!r}")
    if name == "digits":
        from robustgrad.data import load_digits

        (x_tr, y_tr), (x_te, y_te) = load_digits(seed=seed)
        return Dataset(name, _images(x_tr), np.asarray(y_tr, np.int64), _images(x_te),
                       np.asarray(y_te, np.int64), 0.0, 1.0)
    if name in _KERAS_FILES:
        home = _keras_home()
        missing = [f for f in _KERAS_FILES[name] if not os.path.exists(os.path.join(home, f))]
        if missing:
            raise FileNotFoundError(
                f"--data {name}: expected the keras.datasets archive "
                f"{os.path.join(home, missing[0])} (no network access to download it); "
                f"place the file there or pass --data path.npz")
        import keras

        (x_tr, y_tr), (x_te, y_te) = getattr(keras.datasets, name).load_data()
        return Dataset(name, _images(x_tr / 255.0), y_tr.reshape(-1).astype(np.int64),
                       _images(x_te / 255.0), y_te.reshape(-1).astype(np.int64), 0.0, 1.0)
    if name.endswith(".npz"):
        arrays = _read_npz(name)
        missing = [k for k in _SPLIT_KEYS if k not in arrays]
        if missing:
            raise ValueError(f"--data {name}: the .npz file must hold arrays "
                             f"{', '.join(_SPLIT_KEYS)}; missing {', '.join(missing)}")
        x_tr, y_tr, x_te, y_te = (arrays[k] for k in _SPLIT_KEYS)
        _check_split(name, x_tr, y_tr, "x_train", "y_train")
        _check_split(name, x_te, y_te, "x_test", "y_test")
        declared = _check_labels(name, y_tr, y_te, arrays.get("num_classes"))
        x_tr, x_te = _images(x_tr), _images(x_te)
        lo, hi = _value_range(x_tr, x_te)
        return Dataset(name, x_tr, y_tr.reshape(-1).astype(np.int64), x_te,
                       y_te.reshape(-1).astype(np.int64), lo, hi, declared)
    raise ValueError(f"unknown dataset {name!r}: expected one of {', '.join(DATASETS)} or a "
                     "path ending in .npz")


def load_test_set(name: str, *, seed: int = 0
                  ) -> tuple[np.ndarray, np.ndarray, float | None, float | None]:
    """``(x_test, y_test, clip_min, clip_max)`` for evaluating a classifier.

    Accepts everything :func:`load_dataset` does, plus an ``.npz`` holding only an evaluation set
    (``x_test, y_test`` or ``x, y``); for such a bare set the bounds are ``None`` (the caller
    decides: ``robustgrad evaluate`` takes the data's range).

    Example:
      >>> x, y, lo, hi = load_test_set("digits")
      >>> x.shape, y.dtype.name, lo, hi
      ((450, 8, 8, 1), 'int64', 0.0, 1.0)
    """
    if isinstance(name, str) and name.endswith(".npz"):
        arrays = _read_npz(name)
        if "x_train" not in arrays:
            for kx, ky in (("x_test", "y_test"), ("x", "y")):
                if kx in arrays and ky in arrays:
                    x, y = arrays[kx], arrays[ky]
                    _check_split(name, x, y, kx, ky)
                    return _images(x), y.reshape(-1).astype(np.int64), None, None
    ds = load_dataset(name, seed=seed)
    return ds.x_test, ds.y_test, ds.clip_min, ds.clip_max

