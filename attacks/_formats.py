"""Readers of the files image datasets are distributed as, in numpy, without pickle.

* IDX (MNIST, Fashion-MNIST; LeCun et al. 1998): a magic number ``0x0000TTDD`` (type ``TT``,
  ``DD`` dimensions), ``DD`` big-endian uint32 sizes, then the values -- :func:`read_idx`;
* the CIFAR-10/100 *binary* version (Krizhevsky 2009): records of 1 (CIFAR-10) or 2 (CIFAR-100:
  coarse, fine) label bytes and 3,072 pixel bytes, channel-major -- :func:`read_cifar_binary`;
  the Python version is pickled and refused;
* SVHN's ``*_32x32.mat`` (Netzer et al. 2011), through ``scipy.io.loadmat`` -- :func:`read_svhn_mat`;
* image folders, one sub-folder per class -- :func:`read_image_folder`.

Every reader returns uint8 images ``[N, H, W, C]`` and int64 labels ``[N]`` and raises a
``ValueError`` naming the file and what is wrong.

>>> import gzip, io, numpy as np
>>> raw = bytes([0, 0, 8, 1]) + (3).to_bytes(4, "big") + bytes([7, 8, 9])
>>> read_idx(io.BytesIO(raw), "labels").tolist()
[7, 8, 9]
"""

from __future__ import annotations

import gzip
import os
import tarfile
import zlib

import numpy as np

__all__ = ["CIFAR_LAYOUT", "IDX_FILES", "IMAGE_EXTENSIONS", "SVHN_FILES", "cifar_archive_kind",
           "find_cifar_python",
           "is_image_folder", "read_cifar_binary", "read_idx", "read_idx_dataset", "read_image_folder",
           "read_svhn_mat"]

_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

#: The four IDX files of MNIST and Fashion-MNIST: (split, images, labels).
IDX_FILES = (
    ("train", "train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    ("test", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
)

#: CIFAR binary layout: name -> (directory in the archive, training files, test files,
#: label bytes per record, the label byte used, classes).
CIFAR_LAYOUT = {
    "cifar10": ("cifar-10-batches-bin", tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
                ("test_batch.bin",), 1, 0, 10),
    "cifar100": ("cifar-100-binary", ("train.bin",), ("test.bin",), 2, 1, 100),
}
_CIFAR_PYTHON = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
_CIFAR_NAMES = {"cifar10": "batches.meta.txt", "cifar100": "fine_label_names.txt"}
_CIFAR_PIXELS = 32 * 32 * 3

SVHN_FILES = (("train", "train_32x32.mat"), ("test", "test_32x32.mat"))

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff",
                    ".webp")


# ------------------------------------------------------------------------------------- IDX

def read_idx(source, label: str) -> np.ndarray:
    """The array of one IDX file (``source``: a path, ``.gz`` or not, or a binary file object).

    Checks the magic number, the type code and that the payload holds exactly the product of the
    sizes; ``label`` names the file in errors.
    """
    try:
        if isinstance(source, (str, os.PathLike)):
            opener = gzip.open if str(source).endswith(".gz") else open
            with opener(source, "rb") as f:
                raw = f.read()
        else:
            raw = source.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{label}: unreadable ({exc}; a truncated download?)") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise ValueError(f"{label}: not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise ValueError(f"{label}: IDX header truncated or without dimensions")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(f"{label}: IDX header says shape {shape} ({expected} bytes) but the file "
                         f"holds {len(raw) - header} bytes after it (truncated?)")
    return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _idx_path(directory: str, stem: str) -> str | None:
    for candidate in (stem + ".gz", stem):
        path = os.path.join(directory, candidate)
        if os.path.isfile(path):
            return path
    return None


def read_idx_dataset(directory: str, *, classes: int | None = None) -> dict[str, np.ndarray]:
    """``x_train, y_train, x_test, y_test`` from the four IDX files in ``directory``.

    Images must be ``[N, H, W]`` uint8, labels ``[N]`` with as many entries; with ``classes``,
    labels must lie in ``0 .. classes-1``.
    """
    out = {}
    for split, images, labels in IDX_FILES:
        pi, pl = _idx_path(directory, images), _idx_path(directory, labels)
        if pi is None or pl is None:
            missing = images if pi is None else labels
            raise FileNotFoundError(f"{directory}: no {missing}.gz (the IDX files of MNIST: "
                                    f"{', '.join(s + '.gz' for _, *p in IDX_FILES for s in p)})")
        x, y = read_idx(pi, pi), read_idx(pl, pl)
        if x.ndim != 3 or x.dtype != np.uint8:
            raise ValueError(f"{pi}: expected uint8 images [N, H, W], got {x.dtype} {x.shape}")
        if y.ndim != 1 or len(y) != len(x):
            raise ValueError(f"{pl}: expected {len(x)} labels for {pi}, got shape {y.shape}")
        if classes is not None and (y.min() < 0 or y.max() >= classes):
            raise ValueError(f"{pl}: labels must lie in 0..{classes - 1}, found {y.min()}.."
                             f"{y.max()}")
        out["x_" + split], out["y_" + split] = x[..., None], y.astype(np.int64)
    return out


# ----------------------------------------------------------------------------------- CIFAR

def _read_members(source: str, wanted: list[str]) -> dict[str, bytes]:
    """The bytes of the ``wanted`` member paths found in a ``.tar.gz`` or a directory (in one
    sequential pass over an archive: a gzip stream has no random access)."""
    found = {}
    if os.path.isdir(source):
        for member in wanted:
            for path in (os.path.join(source, member),
                         os.path.join(source, os.path.basename(member))):
                if os.path.isfile(path):
                    with open(path, "rb") as f:
                        found[member] = f.read()
                    break
        return found
    try:
        with tarfile.open(source, "r:*") as tar:
            for info in tar:
                name = info.name[2:] if info.name.startswith("./") else info.name
                data = tar.extractfile(info) if info.isfile() and name in wanted else None
                if data is not None:
                    found[name] = data.read()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{source}: not a readable .tar.gz archive ({exc}; a truncated "
                         "download?)") from None
    return found


def cifar_archive_kind(source: str) -> str | None:
    """What a CIFAR path holds, from its name and, for an archive, its first member's folder:
    ``"cifar10"`` or ``"cifar100"`` (binary), ``"python"`` (the pickled version) or ``None``."""
    base = os.path.basename(source.rstrip(os.sep))
    folders = {v: k for k, v in _CIFAR_PYTHON.items()}
    if base in folders or base.startswith(("cifar-10-python", "cifar-100-python")):
        return "python"
    binary = {layout[0]: k for k, layout in CIFAR_LAYOUT.items()}
    if base in binary:
        return binary[base]
    if os.path.isfile(source):
        try:
            with tarfile.open(source, "r:*") as tar:
                first = tar.next()
        except (tarfile.TarError, OSError, EOFError, zlib.error):
            return None
        top = first.name[2:] if first is not None and first.name.startswith("./") else \
            (first.name if first is not None else "")
        top = top.split("/")[0]
        return "python" if top in folders else binary.get(top)
    return None


def find_cifar_python(source: str) -> bool:
    """Whether ``source`` (a path) looks like the pickled Python version of CIFAR."""
    return cifar_archive_kind(source) == "python"


def read_cifar_binary(source: str, name: str) -> dict[str, np.ndarray]:
    """``x_train, y_train, x_test, y_test`` of CIFAR-10 or CIFAR-100 (``name``) from the binary
    archive ``source`` (``cifar-10-binary.tar.gz``) or its extracted directory.

    CIFAR-100 gives the 100 fine labels. Record counts and label ranges are checked. When the
    archive holds the class names (``batches.meta.txt``, ``fine_label_names.txt``), they come
    back as ``class_names``.
    """
    directory, train_files, test_files, label_bytes, label_at, classes = CIFAR_LAYOUT[name]
    if find_cifar_python(source):
        raise ValueError(f"{source}: the Python version of CIFAR is pickled, and unpickling a file "
                         f"can run any code: it is not read; use the binary version "
                         f"({directory.replace('-batches-bin', '-binary')}.tar.gz)")
    members = {split: [f"{directory}/{f}" for f in files]
               for split, files in (("train", train_files), ("test", test_files))}
    names_file = f"{directory}/{_CIFAR_NAMES[name]}"
    raw_members = _read_members(source, [*members["train"], *members["test"], names_file])
    record = label_bytes + _CIFAR_PIXELS
    out = {}
    for split, wanted in members.items():
        xs, ys = [], []
        for member in wanted:
            raw = raw_members.get(member)
            if raw is None:
                raise ValueError(f"{source}: no {member} (is this the {name} binary version, "
                                 f"{directory.replace('-batches-bin', '-binary')}.tar.gz?)")
            if len(raw) == 0 or len(raw) % record:
                raise ValueError(f"{source}: {member} holds {len(raw)} bytes, not a whole "
                                 f"number of {record}-byte records (truncated?)")
            rows = np.frombuffer(raw, np.uint8).reshape(-1, record)
            y = rows[:, label_at].astype(np.int64)
            if y.max() >= classes:
                raise ValueError(f"{source}: {member} has label {y.max()}, expected 0.."
                                 f"{classes - 1}")
            xs.append(rows[:, label_bytes:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            ys.append(y)
        out["x_" + split], out["y_" + split] = np.concatenate(xs), np.concatenate(ys)
    text = raw_members.get(names_file, b"").decode("utf-8", "replace").split()
    if len(text) == classes:
        out["class_names"] = np.asarray(text)
    return out


# ------------------------------------------------------------------------------------ SVHN

def read_svhn_mat(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Images ``[N, 32, 32, 3]`` uint8 and labels ``[N]`` (digit 0 is stored as 10, mapped to 0)
    of one SVHN ``*_32x32.mat`` file (MATLAB v5, read by ``scipy.io.loadmat``; no pickle)."""
    from scipy.io import loadmat

    try:
        mat = loadmat(path)
    except (ValueError, OSError, TypeError, EOFError, zlib.error) as exc:
        raise ValueError(f"{path}: not a readable .mat file ({exc}; a truncated download?)") \
            from None
    if "X" not in mat or "y" not in mat:
        raise ValueError(f"{path}: an SVHN .mat file holds arrays X and y; found "
                         f"{', '.join(k for k in mat if not k.startswith('__')) or 'none'}")
    x, y = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1)
    if x.ndim != 4 or x.shape[2] != 3 or x.shape[3] != len(y):
        raise ValueError(f"{path}: X must be [32, 32, 3, N] with N = {len(y)} labels, "
                         f"got {x.shape}")
    y = y.astype(np.int64)
    if y.min() < 1 or y.max() > 10:
        raise ValueError(f"{path}: SVHN labels are 1..10, found {y.min()}..{y.max()}")
    return np.ascontiguousarray(x.transpose(3, 0, 1, 2)).astype(np.uint8), y % 10


# ---------------------------------------------------------------------------- image folders

def _class_dirs(root: str) -> list[str]:
    return sorted(d for d in os.listdir(root)
                  if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))


class _RefusedImageError(Exception):
    """An image that opens but is not read (its message is the user's line)."""


def _read_images(root: str, classes: list[str], size: tuple | None, mode: str | None,
                 every_class: bool = True, first: str | None = None):
    """The images of ``root/<class>/*`` for each of ``classes``; a folder inside a class
    folder (its images would be lost) and, with ``every_class``, a class without an image are
    refused, naming the folder."""
    from PIL import Image, UnidentifiedImageError

    stray = sorted(f for f in os.listdir(root) if f.lower().endswith(IMAGE_EXTENSIONS)
                   and os.path.isfile(os.path.join(root, f)))
    if stray:  # an image of no class: it would be skipped in silence
        raise ValueError(f"{os.path.join(root, stray[0])}: an image outside every class folder"
                         f"{f' (and {len(stray) - 1} more)' if len(stray) > 1 else ''}, which "
                         "belongs to no class; move it into its class's folder, or out of "
                         f"{root}")
    inside = os.path.realpath(root) + os.sep
    xs: list[np.ndarray] = []
    ys: list[int] = []
    for label, cls in enumerate(classes):
        folder = os.path.join(root, cls)
        if not os.path.isdir(folder):
            continue
        if not os.path.realpath(folder).startswith(inside):
            raise ValueError(f"{folder}: a link to {os.path.realpath(folder)}, outside {root}; "
                             "a dataset is read from inside its own folder: copy the images in")
        inner = _class_dirs(folder)
        if inner:
            raise ValueError(f"{os.path.join(folder, inner[0])}: a folder inside the class folder "
                             f"{cls!r}, whose images would not be read; put each class's images "
                             f"directly in its folder ({folder}/*.png)")
        before = len(xs)
        for fname in sorted(os.listdir(folder)):
            if not fname.lower().endswith(IMAGE_EXTENSIONS):
                continue
            path = os.path.join(folder, fname)
            if not os.path.realpath(path).startswith(inside):
                raise ValueError(f"{path}: a link to {os.path.realpath(path)}, outside {root}; "
                                 "a dataset is read from inside its own folder: copy the "
                                 "image in")
            try:
                with Image.open(path) as im:
                    im.load()
                    if im.mode.startswith(("I", "F")):  # PIL's convert to 8 bits clips these
                        raise _RefusedImageError(f"{path}: an image of mode {im.mode} (more than 8 bits per "
                                       "pixel), whose values would be clipped to 0-255; save "
                                       "it as an 8-bit image")
                    gray = im.mode in ("1", "L", "LA")
                    if mode is None:
                        mode, first = ("L" if gray else "RGB"), path
                    elif mode == "L" and not gray:
                        raise _RefusedImageError(f"{path}: a colour ({im.mode}) image, but the folder's "
                                       f"first image ({first}) is grayscale, so it is read as "
                                       "grayscale and this image's colour would be lost; save "
                                       "every image in one mode")
                    arr = np.asarray(im.convert(mode), np.uint8)
            except _RefusedImageError as exc:
                raise ValueError(str(exc)) from None
            except (OSError, UnidentifiedImageError, ValueError) as exc:
                raise ValueError(f"{path}: not a readable image ({exc})") from None
            arr = arr[..., None] if arr.ndim == 2 else arr
            if size is None:
                size = arr.shape[:2]
            elif arr.shape[:2] != size:
                raise ValueError(f"{path}: is {arr.shape[1]}x{arr.shape[0]} pixels but the other "
                                 f"images are {size[1]}x{size[0]}; resize them to one size")
            xs.append(arr)
            ys.append(label)
        if every_class and len(xs) == before:
            raise ValueError(f"{folder}: the class folder {cls!r} holds no images "
                             f"({', '.join(IMAGE_EXTENSIONS)}); add images or remove the folder")
    return xs, ys, size, mode, first


def read_image_folder(root: str, *, seed: int = 0, test_fraction: float = 0.25
                      ) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """An image-folder dataset: ``(arrays, class names)``.

    Either ``root/train/<class>/*`` and ``root/test/<class>/*`` (classes named by the training
    folders), or ``root/<class>/*`` split per class by ``seed`` (``test_fraction`` of each class,
    at least one image when a class has two or more, goes to the test split). Classes are the
    sub-folder names in sorted order (label 0 is the first). Images must share one size; they
    are read as grayscale when the first one is (a colour image after it is refused: its colour
    would be lost), else RGB; images of more than 8 bits per pixel, images outside every class
    folder and links to outside the folder are refused, naming the file.
    """
    splits = {}
    if os.path.isdir(os.path.join(root, "train")) and os.path.isdir(os.path.join(root, "test")):
        classes = _class_dirs(os.path.join(root, "train"))
        extra = sorted(set(_class_dirs(os.path.join(root, "test"))) - set(classes))
        if extra:
            raise ValueError(f"{root}: test classes {', '.join(extra)} have no training folder")
        size = mode = first = None
        for split in ("train", "test"):
            xs, ys, size, mode, first = _read_images(os.path.join(root, split), classes, size,
                                                     mode, every_class=split == "train",
                                                     first=first)
            if not xs:
                raise ValueError(f"{os.path.join(root, split)}: no images ({', '.join(IMAGE_EXTENSIONS)})"
                                 " in its class folders")
            splits[split] = (np.stack(xs), np.asarray(ys, np.int64))
    else:
        halves = [d for d in ("train", "test") if os.path.isdir(os.path.join(root, d))]
        if len(halves) == 1:  # not a class named "train": a split without its other half
            other = "test" if halves[0] == "train" else "train"
            raise ValueError(f"{root}: holds {halves[0]}/ but no {other}/; give both "
                             f"({root}/train/<class>/*, {root}/test/<class>/*), or one folder "
                             "per class to be split")
        classes = _class_dirs(root)
        if len(classes) < 2:
            raise ValueError(f"{root}: an image folder needs one sub-folder per class (at least "
                             f"2), found {len(classes)}")
        xs, ys, _, _, _ = _read_images(root, classes, None, None)
        if not xs:
            raise ValueError(f"{root}: no images ({', '.join(IMAGE_EXTENSIONS)}) in its class "
                             "folders")
        x, y = np.stack(xs), np.asarray(ys, np.int64)
        rng = np.random.default_rng(seed)
        test = np.zeros(len(y), bool)
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            k = int(round(test_fraction * len(idx))) if len(idx) > 1 else 0
            test[idx[:max(k, 1 if len(idx) > 1 else 0)]] = True
        if not test.any():  # every class has one image: it stays for training
            raise ValueError(f"{root}: every class folder holds a single image, which stays in "
                             f"the training split, so no image is left for the test split; put "
                             f"at least 2 images in a class folder (or give {root}/train and "
                             f"{root}/test)")
        splits = {"train": (x[~test], y[~test]), "test": (x[test], y[test])}
    out = {f"{k}_{s}": v for s, (x, y) in splits.items() for k, v in (("x", x), ("y", y))}
    return out, tuple(classes)


def is_image_folder(root: str) -> bool:
    """Whether ``root`` is a directory whose sub-folders (or ``train/``'s) hold images."""
    if not os.path.isdir(root):
        return False
    base = os.path.join(root, "train") if os.path.isdir(os.path.join(root, "train")) else root
    for cls in _class_dirs(base):
        if any(f.lower().endswith(IMAGE_EXTENSIONS) for f in os.listdir(os.path.join(base, cls))):
            return True
    return False

