"""Datasets for adversarial training and evaluation (the ``--data`` of the command line).

:func:`load_dataset` accepts

* ``digits``: embedded (scikit-learn's 8x8 digits through :func:`robustgrad.data.load_digits`);
* ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``, ``svhn``: the published files, fetched
  on first use into the cache (``~/.keras/datasets``, or ``$ROBUSTGRAD_DATA_DIR``; see
  :mod:`attacks._download`) with a progress bar, size and checksum verified before a file enters
  the cache. ``download=False`` (or ``ROBUSTGRAD_NO_DOWNLOAD=1``) refuses to fetch; a missing file
  or a failed download is one line saying which file to put where. CIFAR is read from its
  *binary* version (the Python version is pickled and refused), SVHN from its ``.mat`` files
  (``train`` and ``test``; digit 0 is label 0);
* a path: an ``.npz`` file holding ``x_train, y_train, x_test, y_test`` (and optionally
  ``num_classes``: the classes are the declared ones, else the test set's; a training label
  outside them is an error); a directory holding the
  four IDX files of MNIST / Fashion-MNIST (``train-images-idx3-ubyte.gz`` ...), the CIFAR binary
  files, or SVHN's ``train_32x32.mat`` and ``test_32x32.mat``; a CIFAR binary ``.tar.gz``; or an
  image folder (one sub-folder per class, optionally under ``train/`` and ``test/``).

:func:`load_test_set` also accepts an ``.npz`` holding only an evaluation set (``x_test,
y_test`` or ``x, y``).

Images come back as float32 NHWC (``[N, H, W, C]``; a channel axis is added to ``[N, H, W]``
arrays, but not to ``[N, L, 1]``: an array whose last axis is 1 already has its channel, as a
sequence of ``L`` one-channel values) in ``[0, 1]`` (8-bit pixels divided by 255, in ``.npz`` files
too: a ``uint8`` array is 8-bit pixels); ``.npz`` files of floats keep their own value range,
reported as ``clip_min``/``clip_max``. An ``.npz`` array of any other integer dtype (``int64``
pixels 0-255 as much as ``int16`` counts) is refused rather than guessed, with the conversion
for each reading; so are an ``x_train`` and an ``x_test`` of which only one is ``uint8``.
Labels come back as int64 of shape ``[N]``. Every problem with a file (not a zip archive,
truncated, missing arrays, strings, empty arrays, NaN, labels that are not class indices) is a
``ValueError`` (``FileNotFoundError`` for a missing file) naming the file and what is wrong,
raised before any training or evaluation starts.

Example:
  >>> ds = load_dataset("digits")
  >>> ds.x_train.shape, ds.x_test.dtype.name, ds.num_classes, (ds.clip_min, ds.clip_max)
  ((1347, 8, 8, 1), 'float32', 10, (0.0, 1.0))
  >>> load_dataset("imagenet")  # doctest: +ELLIPSIS
  Traceback (most recent call last):
  ...
  ValueError: unknown dataset 'imagenet': expected one of digits, mnist, ... or a path to ...
"""

from __future__ import annotations

import dataclasses
import os
import zipfile

import numpy as np

from . import _download, _formats

__all__ = ["DATASETS", "Dataset", "load_dataset", "load_test_set"]

DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100", "svhn")

_KERAS_BASE = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"
_FASHION_BASE = "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/"
_TORONTO_BASE = "https://www.cs.toronto.edu/~kriz/"
_SVHN_BASE = "http://ufldl.stanford.edu/housenumbers/"
_FASHION_MD5 = {
    "train-images-idx3-ubyte": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte": "bb300cfdad3c16e7a12a480ee83cd310",
}

# The published files of each named dataset, as cached under attacks._download.cache_dir() (the
# same names keras.datasets uses where it has the dataset, so files Keras fetched are reused).
_REMOTE_FILES = {
    "mnist": (_download.RemoteFile(
        "mnist.npz", _KERAS_BASE + "mnist.npz", "sha256",
        "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"),),
    "fashion_mnist": tuple(
        _download.RemoteFile(f"fashion-mnist/{stem}.gz", f"{_FASHION_BASE}{stem}.gz", "md5", md5)
        for stem, md5 in _FASHION_MD5.items()),
    "cifar10": (_download.RemoteFile(
        "cifar-10-binary.tar.gz", _TORONTO_BASE + "cifar-10-binary.tar.gz", "md5",
        "c32a1d4ab5d03f1284b67883e8d87530", 170_052_171),),
    "cifar100": (_download.RemoteFile(
        "cifar-100-binary.tar.gz", _TORONTO_BASE + "cifar-100-binary.tar.gz", "md5",
        "03b5dce01913d631647c71ecec9e9cb8", 168_513_733),),
    "svhn": (
        _download.RemoteFile("svhn/train_32x32.mat", _SVHN_BASE + "train_32x32.mat", "md5",
                             "e26dedcc434d2e4c54c9b2d4a06d8373"),
        _download.RemoteFile("svhn/test_32x32.mat", _SVHN_BASE + "test_32x32.mat", "md5",
                             "eb5a983be6a315427106f1b164d9cef3"),
    ),
}
_CLASS_NAMES = {
    "fashion_mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                      "Sneaker", "Bag", "Ankle boot"),
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                "truck"),
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
    class_names: tuple = ()
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
    if x.dtype.kind in "iu" and x.dtype != np.uint8:  # 8-bit pixels, or values in own units?
        raise ValueError(f"data {name!r}: {kx} holds {x.dtype} integers; only uint8 arrays are "
                         "read as 8-bit pixels (divided by 255), and other integers are not "
                         "guessed: save x.astype(np.uint8) for 8-bit images, or "
                         "x.astype(np.float32) to keep the values in their own units")
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
    """``x`` as float32, with a channel axis added to grayscale images ``[N, H, W]``. An array
    whose last axis has size 1 already ends in its channel (``[N, 64, 1]``: 64 one-channel
    values, the shape a ``(64, 1)`` model takes; no image is one pixel wide), so it is kept."""
    x = np.asarray(x, np.float32)
    return x[..., None] if x.ndim == 3 and x.shape[-1] != 1 else x


def _npz_images(x: np.ndarray) -> np.ndarray:
    """An ``.npz`` array as float32 NHWC: 8-bit (uint8) pixels divided by 255, as every other
    8-bit source (an eps of 0.3 meant for [0, 1] must not silently become 0.3/255); float arrays
    keep their values."""
    return _pixels(x) if np.asarray(x).dtype == np.uint8 else _images(x)


def _value_range(*arrays: np.ndarray) -> tuple[float, float]:
    lo = float(min(a.min() for a in arrays))
    hi = float(max(a.max() for a in arrays))
    return (0.0, 1.0) if lo >= 0.0 and hi <= 1.0 else (lo, hi)


def _pixels(x: np.ndarray) -> np.ndarray:
    """8-bit images as float32 in [0, 1], NHWC (without a float64 intermediate)."""
    out = np.asarray(x).astype(np.float32)
    out *= np.float32(1.0 / 255.0)
    return _images(out)


def _from_uint8(name: str, arrays: dict, class_names: tuple = (), classes: int | None = None
                ) -> Dataset:
    """A :class:`Dataset` of 8-bit images; with ``classes``, every label must be a class index
    (a ``ValueError`` naming the dataset, the array and the label otherwise)."""
    for split in ("train", "test"):
        x, y = np.asarray(arrays["x_" + split]), np.asarray(arrays["y_" + split]).reshape(-1)
        if x.dtype != np.uint8 or x.ndim not in (3, 4) or len(x) != len(y) or len(x) == 0:
            raise ValueError(f"--data {name}: x_{split} must be 8-bit images [N, H, W(, C)] with "
                             f"one label each; got {x.dtype} {x.shape} and {len(y)} labels")
        if classes is not None and (y.min() < 0 or y.max() >= classes):
            bad = int(y.min()) if y.min() < 0 else int(y.max())
            raise ValueError(f"--data {name}: y_{split} holds label {bad}, outside the "
                             f"{classes} classes (0-{classes - 1})")
    return Dataset(name, _pixels(arrays["x_train"]), arrays["y_train"].reshape(-1).astype(np.int64),
                   _pixels(arrays["x_test"]), arrays["y_test"].reshape(-1).astype(np.int64),
                   0.0, 1.0, class_names=tuple(class_names))


def _from_cifar(name: str, arrays: dict, cifar: str) -> Dataset:
    """A CIFAR :class:`Dataset`: class names from the archive, else the known ones."""
    names = arrays.pop("class_names", None)
    names = tuple(str(n) for n in names) if names is not None else _CLASS_NAMES.get(cifar, ())
    return _from_uint8(name, arrays, names, classes=_formats.CIFAR_LAYOUT[cifar][-1])


def _load_named(name: str, download: bool, progress: bool) -> Dataset:
    """One of the downloadable :data:`DATASETS`, fetched into the cache when missing."""
    what = f"--data {name}"
    try:
        paths = [_download.ensure_file(f, what=what, download=download, progress=progress)
                 for f in _REMOTE_FILES[name]]
    except (FileNotFoundError, _download.DownloadError) as exc:
        python_version = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}.get(name)
        if python_version and os.path.exists(os.path.join(_download.cache_dir(), python_version)):
            raise type(exc)(f"{exc} (the pickled Python version in {_download.cache_dir()} is not "
                            "read: unpickling can run code)") from None
        raise
    try:
        return _read_named(name, paths)
    except ValueError as exc:  # a corrupt file in the cache (put there by hand, or by a tool)
        raise ValueError(f"{exc}; delete {' and '.join(paths)} to download it again") from None


def _read_named(name: str, paths: list[str]) -> Dataset:
    if name == "mnist":
        arrays = _read_npz(paths[0])
        missing = [k for k in _SPLIT_KEYS if k not in arrays]
        if missing:
            raise ValueError(f"--data mnist: {paths[0]} lacks {', '.join(missing)}")
        return _from_uint8(name, {k: arrays[k] for k in _SPLIT_KEYS}, tuple(map(str, range(10))),
                           classes=10)
    if name == "fashion_mnist":
        return _from_uint8(name, _formats.read_idx_dataset(os.path.dirname(paths[0]), classes=10),
                           _CLASS_NAMES[name], classes=10)
    if name in ("cifar10", "cifar100"):
        return _from_cifar(name, _formats.read_cifar_binary(paths[0], name), name)
    (x_tr, y_tr), (x_te, y_te) = (_formats.read_svhn_mat(p) for p in paths)
    return _from_uint8(name, {"x_train": x_tr, "y_train": y_tr, "x_test": x_te, "y_test": y_te},
                       tuple(map(str, range(10))), classes=10)


def _load_path(path: str, seed: int) -> Dataset:
    """A dataset from a local directory or CIFAR ``.tar.gz`` (not ``.npz``: see load_dataset)."""
    if os.path.isdir(path):
        entries = set(os.listdir(path))
        if any(e.startswith(stem) for _, *stems in _formats.IDX_FILES for stem in stems
               for e in entries):
            return _from_uint8(path, _formats.read_idx_dataset(path))
        for cifar, (folder, train, _, _, _, _) in _formats.CIFAR_LAYOUT.items():
            if folder in entries or train[0] in entries:
                return _from_cifar(path, _formats.read_cifar_binary(path, cifar), cifar)
        if all(f in entries for _, f in _formats.SVHN_FILES):
            (x_tr, y_tr), (x_te, y_te) = (_formats.read_svhn_mat(os.path.join(path, f))
                                          for _, f in _formats.SVHN_FILES)
            return _from_uint8(path, {"x_train": x_tr, "y_train": y_tr, "x_test": x_te,
                                      "y_test": y_te})
        if _formats.is_image_folder(path):
            arrays, classes = _formats.read_image_folder(path, seed=seed)
            return _from_uint8(path, arrays, classes, classes=len(classes))
        raise ValueError(f"--data {path}: a directory must hold the IDX files of MNIST "
                         "(train-images-idx3-ubyte.gz ...), the CIFAR binary files, SVHN's "
                         "train_32x32.mat and test_32x32.mat, or one sub-folder of images per "
                         "class; found none of these")
    kind = _formats.cifar_archive_kind(path)
    if kind == "python":
        raise ValueError(f"--data {path}: the Python version of CIFAR is pickled, and unpickling "
                         "a file can run any code: it is not read; use the binary version "
                         "(cifar-10-binary.tar.gz or cifar-100-binary.tar.gz)")
    if kind is None:
        raise ValueError(f"--data {path}: not a CIFAR binary archive (expected its files under "
                         "cifar-10-batches-bin/ or cifar-100-binary/)")
    return _from_cifar(path, _formats.read_cifar_binary(path, kind), kind)


_UNKNOWN = ("or a path to an .npz file, a directory (IDX files, CIFAR binary files, SVHN .mat "
            "files, or one folder of images per class) or a CIFAR binary .tar.gz")


def load_dataset(name: str, *, seed: int = 0, download: bool = True,
                 progress: bool = True) -> Dataset:
    """Load a dataset by name or path; every problem raises before any work.

    Args:
        name: one of :data:`DATASETS`, or a path (see the module docstring for what a path may
            be: ``.npz``, a directory, a CIFAR binary ``.tar.gz``).
        seed: the train/test split of ``digits`` and of an image folder without ``train/`` and
            ``test/`` (the other datasets come split).
        download: fetch a named dataset's files when they are not in the cache (a user's
            request, so the network is used); ``False`` refuses, naming the file and where to
            put it. ``ROBUSTGRAD_NO_DOWNLOAD=1`` in the environment refuses too.
        progress: show a download progress bar on a terminal.

    Raises:
        FileNotFoundError: a missing file, or a named dataset not in the cache with downloads off.
        OSError: (:class:`attacks._download.DownloadError`) a download that failed; nothing
            corrupt is left in the cache and the next call retries.
        ValueError: an unknown name or a file that does not hold a usable dataset.
    """
    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"data must be a dataset name or a path, got {name!r}")
    name = os.fspath(name)
    if name == "digits":
        from robustgrad.data import load_digits

        (x_tr, y_tr), (x_te, y_te) = load_digits(seed=seed)
        return Dataset(name, _images(x_tr), np.asarray(y_tr, np.int64), _images(x_te),
                       np.asarray(y_te, np.int64), 0.0, 1.0, class_names=tuple(map(str, range(10))))
    if name in _REMOTE_FILES:
        return _load_named(name, download, progress)
    if name.endswith(".npz"):
        arrays = _read_npz(name)
        missing = [k for k in _SPLIT_KEYS if k not in arrays]
        if missing:
            raise ValueError(f"--data {name}: the .npz file must hold arrays "
                             f"{', '.join(_SPLIT_KEYS)}; missing {', '.join(missing)}")
        x_tr, y_tr, x_te, y_te = (arrays[k] for k in _SPLIT_KEYS)
        _check_split(name, x_tr, y_tr, "x_train", "y_train")
        _check_split(name, x_te, y_te, "x_test", "y_test")
        if (x_tr.dtype == np.uint8) != (x_te.dtype == np.uint8):  # one split divided by 255
            raise ValueError(f"data {name!r}: x_train is {x_tr.dtype} and x_test {x_te.dtype}; "
                             "a uint8 array is read as 8-bit pixels (divided by 255) and any "
                             "other as its own values, so the splits would be in different "
                             "units: save both as uint8, or both as float")
        declared = _check_labels(name, y_tr, y_te, arrays.get("num_classes"))
        x_tr, x_te = _npz_images(x_tr), _npz_images(x_te)
        lo, hi = _value_range(x_tr, x_te)
        return Dataset(name, x_tr, y_tr.reshape(-1).astype(np.int64), x_te,
                       y_te.reshape(-1).astype(np.int64), lo, hi, declared_classes=declared)
    if os.path.isdir(name) or name.endswith((".tar.gz", ".tgz", ".tar")):
        if not os.path.exists(name):
            raise FileNotFoundError(f"--data {name}: no such file")
        return _load_path(name, seed)
    raise ValueError(f"unknown dataset {name!r}: expected one of {', '.join(DATASETS)} "
                     + _UNKNOWN)


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
                    return _npz_images(x), y.reshape(-1).astype(np.int64), None, None
    ds = load_dataset(name, seed=seed)
    return ds.x_test, ds.y_test, ds.clip_min, ds.clip_max

