"""Dataset loading for adversarial training and evaluation (``--data`` of the CLI).

``load_dataset(name)`` accepts ``digits`` (embedded, scikit-learn's 8x8 digits), ``mnist``,
``fashion_mnist``, ``cifar10`` (through ``keras.datasets``, only when the archive is already
on disk -- nothing is downloaded) or a path to an ``.npz`` file holding ``x_train, y_train,
x_test, y_test``. Images come back as float32 NHWC in [0, 1] (npz files are kept in their own
range, which is reported as ``clip_min``/``clip_max``), labels as int64.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

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


@dataclasses.dataclass
class Dataset:
    """Arrays of one dataset and the value range its pixels live in."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    clip_min: float
    clip_max: float

    @property
    def num_classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1

    @property
    def input_shape(self) -> tuple:
        return tuple(self.x_train.shape[1:])


def _keras_home() -> str:
    base = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return os.path.join(base, "datasets")


def _load_digits(test_size: float = 0.25, seed: int = 0):
    try:  # the core's loader, once it exists
        from robustgrad.data import load_digits  # type: ignore

        return load_digits(test_size=test_size, seed=seed)
    except ImportError:
        pass
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    d = sk_digits()
    x = (d.images.astype(np.float32) / 16.0)[..., None]
    y = d.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_size, random_state=seed, stratify=y
    )
    return (x_tr, y_tr), (x_te, y_te)


def _check_arrays(name, x_tr, y_tr, x_te, y_te):
    for split, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        if x.ndim < 2 or len(x) != len(y):
            raise ValueError(
                f"data {name!r}: x_{split} has shape {x.shape} but y_{split} has {len(y)} labels"
            )
        if y.ndim != 1 and not (y.ndim == 2 and y.shape[1] == 1):
            raise ValueError(
                f"data {name!r}: y_{split} must be integer class labels of shape (N,), "
                f"got shape {y.shape}"
            )
        if not np.issubdtype(y.dtype, np.integer):
            if not np.all(np.equal(np.mod(y, 1), 0)):
                raise ValueError(f"data {name!r}: y_{split} must hold integer class labels")
        if (y < 0).any():
            raise ValueError(f"data {name!r}: y_{split} holds negative labels")
        if not np.isfinite(x).all():
            raise ValueError(f"data {name!r}: x_{split} holds NaN or infinite values")


def load_dataset(name: str, *, seed: int = 0) -> Dataset:
    """Load a dataset by name or ``.npz`` path; raise ``ValueError``/``FileNotFoundError`` early."""
    if name == "digits":
        (x_tr, y_tr), (x_te, y_te) = _load_digits(seed=seed)
        x_tr, x_te = np.asarray(x_tr, np.float32), np.asarray(x_te, np.float32)
        if x_tr.ndim == 3:
            x_tr, x_te = x_tr[..., None], x_te[..., None]
        return Dataset(name, x_tr, np.asarray(y_tr, np.int64), x_te,
                       np.asarray(y_te, np.int64), 0.0, 1.0)
    if name in _KERAS_FILES:
        home = _keras_home()
        missing = [f for f in _KERAS_FILES[name] if not os.path.exists(os.path.join(home, f))]
        if missing:
            raise FileNotFoundError(
                f"--data {name}: expected the keras.datasets archive "
                f"{os.path.join(home, missing[0])} (no network access to download it); "
                f"place the file there or pass --data path.npz"
            )
        import keras

        loader = getattr(keras.datasets, name)
        (x_tr, y_tr), (x_te, y_te) = loader.load_data()
        x_tr = x_tr.astype(np.float32) / 255.0
        x_te = x_te.astype(np.float32) / 255.0
        if x_tr.ndim == 3:
            x_tr, x_te = x_tr[..., None], x_te[..., None]
        return Dataset(name, x_tr, y_tr.reshape(-1).astype(np.int64), x_te,
                       y_te.reshape(-1).astype(np.int64), 0.0, 1.0)
    if name.endswith(".npz"):
        if not os.path.exists(name):
            raise FileNotFoundError(f"--data {name}: no such file")
        with np.load(name) as f:
            keys = ("x_train", "y_train", "x_test", "y_test")
            missing = [k for k in keys if k not in f.files]
            if missing:
                raise ValueError(
                    f"--data {name}: the .npz file must hold arrays {', '.join(keys)}; "
                    f"missing {', '.join(missing)}"
                )
            x_tr, y_tr, x_te, y_te = (np.asarray(f[k]) for k in keys)
        _check_arrays(name, x_tr, y_tr, x_te, y_te)
        x_tr, x_te = x_tr.astype(np.float32), x_te.astype(np.float32)
        if x_tr.ndim == 3:
            x_tr, x_te = x_tr[..., None], x_te[..., None]
        lo = float(min(x_tr.min(), x_te.min()))
        hi = float(max(x_tr.max(), x_te.max()))
        if lo >= 0.0 and hi <= 1.0:
            lo, hi = 0.0, 1.0
        return Dataset(name, x_tr, y_tr.reshape(-1).astype(np.int64), x_te,
                       y_te.reshape(-1).astype(np.int64), lo, hi)
    raise ValueError(
        f"unknown dataset {name!r}: expected one of {', '.join(DATASETS)} or a path ending in .npz"
    )
