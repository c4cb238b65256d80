"""attacks.data: the named datasets (from files the tests write, never the network), the IDX,
CIFAR-binary, SVHN .mat and image-folder readers, and downloads with a fake fetch function that
fails half-way, offline, or with a wrong checksum."""

import gzip
import hashlib
import io
import os
import re
import tarfile
import urllib.error

import numpy as np
import pytest

from attacks import _download, data
from attacks.data import load_dataset

# ---------------------------------------------------------------------------- file writers

def _idx_bytes(arr: np.ndarray) -> bytes:
    arr = np.asarray(arr, np.uint8)
    return bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape) \
        + arr.tobytes()


def _write_idx_dir(directory, n_train=6, n_test=4, size=5, gz=True):
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n, stem in (("train", n_train, "train"), ("test", n_test, "t10k")):
        x = rng.integers(0, 256, (n, size, size), dtype=np.uint8)
        y = np.arange(n, dtype=np.uint8) % 10
        arrays[split] = (x, y)
        for kind, arr in (("images-idx3-ubyte", x), ("labels-idx1-ubyte", y)):
            path = os.path.join(directory, f"{stem}-{kind}" + (".gz" if gz else ""))
            with (gzip.open if gz else open)(path, "wb") as f:
                f.write(_idx_bytes(arr))
    return arrays


def _cifar_records(n, label_bytes, classes, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, (n, label_bytes), dtype=np.uint8)
    pixels = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    raw = np.concatenate([labels, pixels.reshape(n, -1)], axis=1).tobytes()
    return raw, labels[:, -1].astype(np.int64), pixels.transpose(0, 2, 3, 1)


def _tar_gz(members: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def _cifar10_archive(per_batch=2):
    members, expect = {}, {"y_train": [], "x_train": []}
    for i in range(1, 6):
        raw, y, x = _cifar_records(per_batch, 1, 10, seed=i)
        members[f"cifar-10-batches-bin/data_batch_{i}.bin"] = raw
        expect["y_train"].append(y)
        expect["x_train"].append(x)
    raw, y, x = _cifar_records(3, 1, 10, seed=9)
    members["cifar-10-batches-bin/test_batch.bin"] = raw
    expect = {k: np.concatenate(v) for k, v in expect.items()}
    expect.update(y_test=y, x_test=x)
    return _tar_gz(members), expect


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("ROBUSTGRAD_DATA_DIR", str(root))
    return root


# ------------------------------------------------------------------------------------- IDX

@pytest.mark.parametrize("gz", [True, False])
def test_idx_directory_loads_with_pixels_scaled(tmp_path, gz):
    arrays = _write_idx_dir(tmp_path / "idx", gz=gz)
    ds = load_dataset(str(tmp_path / "idx"))
    assert ds.x_train.shape == (6, 5, 5, 1) and ds.x_test.shape == (4, 5, 5, 1)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    np.testing.assert_allclose(ds.x_train[..., 0], arrays["train"][0] / 255.0, atol=1e-7)
    assert ds.y_test.tolist() == [0, 1, 2, 3]
    assert (ds.clip_min, ds.clip_max) == (0.0, 1.0)


def test_idx_bad_magic_and_truncation_name_the_file(tmp_path):
    _write_idx_dir(tmp_path / "a")
    bad = tmp_path / "a" / "train-labels-idx1-ubyte.gz"
    with gzip.open(bad, "wb") as f:
        f.write(b"\x01\x02\x08\x01" + (6).to_bytes(4, "big") + bytes(6))
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte.gz: not an IDX file"):
        load_dataset(str(tmp_path / "a"))
    _write_idx_dir(tmp_path / "b")
    short = tmp_path / "b" / "t10k-images-idx3-ubyte.gz"
    with gzip.open(short, "rb") as f:
        raw = f.read()
    with gzip.open(short, "wb") as f:
        f.write(raw[:-7])
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte.gz: IDX header says shape "
                                         r"\(4, 5, 5\) \(100 bytes\) but the file holds 93"):
        load_dataset(str(tmp_path / "b"))
    # a gzip stream cut short is a one-line ValueError too, not an EOFError
    raw = (tmp_path / "a" / "train-images-idx3-ubyte.gz").read_bytes()
    (tmp_path / "a" / "train-images-idx3-ubyte.gz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="unreadable"):
        load_dataset(str(tmp_path / "a"))


def test_fashion_mnist_by_name_from_the_cache(cache):
    arrays = _write_idx_dir(cache / "fashion-mnist", n_train=3, n_test=2, size=28)
    ds = load_dataset("fashion_mnist", download=False)
    assert ds.input_shape == (28, 28, 1) and len(ds.x_train) == 3 and ds.y_test.tolist() == [0, 1]
    assert ds.class_names[9] == "Ankle boot"
    np.testing.assert_allclose(ds.x_test[1, ..., 0], arrays["test"][0][1] / 255.0, atol=1e-7)


def test_mnist_by_name_reads_the_keras_npz(cache):
    cache.mkdir()
    x = np.full((3, 28, 28), 255, np.uint8)
    np.savez(cache / "mnist.npz", x_train=x, y_train=np.array([1, 2, 3], np.uint8),
             x_test=x[:2], y_test=np.array([0, 9], np.uint8))
    ds = load_dataset("mnist", download=False)
    assert ds.x_train.shape == (3, 28, 28, 1) and float(ds.x_train.max()) == 1.0
    assert ds.y_test.tolist() == [0, 9] and ds.num_classes == 10
    # a file in the cache with labels outside the classes, or not 8-bit images: named errors
    np.savez(cache / "mnist.npz", x_train=x, y_train=np.array([1, 12, 3], np.uint8),
             x_test=x[:2], y_test=np.array([0, 9], np.uint8))
    with pytest.raises(ValueError, match=r"--data mnist: y_train holds label 12, outside the 10 "
                                         r"classes \(0-9\)"):
        load_dataset("mnist", download=False)
    np.savez(cache / "mnist.npz", x_train=x / 255.0, y_train=np.array([1, 2, 3], np.uint8),
             x_test=x[:2], y_test=np.array([0, 9], np.uint8))
    with pytest.raises(ValueError, match="x_train must be 8-bit images.*; delete .*mnist.npz to "
                                         "download it again"):
        load_dataset("mnist", download=False)


# ----------------------------------------------------------------------------------- CIFAR

def test_cifar10_binary_archive_by_path_and_by_name(tmp_path, cache):
    archive, expect = _cifar10_archive()
    path = tmp_path / "cifar-10-binary.tar.gz"
    path.write_bytes(archive)
    for ds in (load_dataset(str(path)), None):
        if ds is None:
            cache.mkdir()
            (cache / "cifar-10-binary.tar.gz").write_bytes(archive)
            ds = load_dataset("cifar10", download=False)
        assert ds.x_train.shape == (10, 32, 32, 3) and ds.x_test.shape == (3, 32, 32, 3)
        assert ds.y_train.tolist() == expect["y_train"].tolist()
        # channel-major records become NHWC: pixel (r, c) of channel k
        np.testing.assert_allclose(ds.x_train * 255.0, expect["x_train"], atol=1e-4)
        np.testing.assert_allclose(ds.x_test * 255.0, expect["x_test"], atol=1e-4)
    assert ds.class_names[0] == "airplane"
    (cache / "cifar-10-binary.tar.gz").write_bytes(archive[: len(archive) // 2])  # put by hand
    with pytest.raises(ValueError, match="truncated.*; delete .*cifar-10-binary.tar.gz to "
                                         "download it again"):
        load_dataset("cifar10", download=False)


def test_cifar100_binary_uses_fine_labels_and_extracted_directory(tmp_path):
    raw_tr, y_tr, _ = _cifar_records(4, 2, 100, seed=1)
    raw_te, y_te, _ = _cifar_records(2, 2, 100, seed=2)
    archive = tmp_path / "c100.tar.gz"  # recognised by its folder, whatever the file's name
    archive.write_bytes(_tar_gz({"cifar-100-binary/train.bin": raw_tr,
                                 "cifar-100-binary/test.bin": raw_te}))
    assert load_dataset(str(archive)).y_test.tolist() == y_te.tolist()
    other = tmp_path / "other.tar.gz"
    other.write_bytes(_tar_gz({"photos/a.bin": raw_te}))
    with pytest.raises(ValueError, match="not a CIFAR binary archive"):
        load_dataset(str(other))
    d = tmp_path / "cifar-100-binary"
    d.mkdir()
    (d / "train.bin").write_bytes(raw_tr)
    (d / "test.bin").write_bytes(raw_te)
    ds = load_dataset(str(d))
    assert ds.y_train.tolist() == y_tr.tolist() and ds.y_test.tolist() == y_te.tolist()
    assert ds.class_names == ()  # no names file: none known
    (d / "fine_label_names.txt").write_text("\n".join(f"class{i}" for i in range(100)) + "\n")
    assert load_dataset(str(d)).class_names[:2] == ("class0", "class1")
    (d / "test.bin").write_bytes(raw_te[:-5])
    with pytest.raises(ValueError, match="not a whole number of 3074-byte records"):
        load_dataset(str(d))


def test_cifar_python_version_is_refused(tmp_path, cache):
    path = tmp_path / "cifar-10-python.tar.gz"
    path.write_bytes(_tar_gz({"cifar-10-batches-py/data_batch_1": b"pickled"}))
    with pytest.raises(ValueError, match="pickled.*not read.*binary version"):
        load_dataset(str(path))
    renamed = tmp_path / "c.tar.gz"  # recognised by its content, not only by its name
    renamed.write_bytes(path.read_bytes())
    with pytest.raises(ValueError, match="pickled"):
        load_dataset(str(renamed))
    (cache / "cifar-10-batches-py").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="cifar-10-binary.tar.gz.*Python version.*not read"):
        load_dataset("cifar10", download=False)


# ------------------------------------------------------------------------------------ SVHN

def test_svhn_mat_files_map_label_10_to_0(tmp_path, cache):
    from scipy.io import savemat

    rng = np.random.default_rng(0)
    d = cache / "svhn"
    d.mkdir(parents=True)
    x = rng.integers(0, 256, (32, 32, 3, 4), dtype=np.uint8)
    savemat(d / "train_32x32.mat", {"X": x, "y": np.array([[10], [1], [5], [10]], np.uint8)})
    savemat(d / "test_32x32.mat", {"X": x[..., :2], "y": np.array([[3], [10]], np.uint8)})
    for ds in (load_dataset("svhn", download=False), load_dataset(str(d))):
        assert ds.y_train.tolist() == [0, 1, 5, 0] and ds.y_test.tolist() == [3, 0]
        assert ds.x_train.shape == (4, 32, 32, 3)
        np.testing.assert_allclose(ds.x_train[2] * 255.0, x[..., 2], atol=1e-4)
    savemat(d / "test_32x32.mat", {"images": x})
    with pytest.raises(ValueError, match="test_32x32.mat: an SVHN .mat file holds arrays X and y"):
        load_dataset("svhn", download=False)


# --------------------------------------------------------------------------- image folders

def _png(path, value, size=(6, 4), mode="RGB"):
    from PIL import Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new(mode, size, value).save(path)


def test_an_image_folder_with_one_image_per_class_names_the_cause(tmp_path):
    root = tmp_path / "ones"
    for cls in ("a", "b"):
        _png(root / cls / "0.png", 128, mode="L")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(root))}: every class folder holds a "
                                         r"single image, which stays in the training split, so "
                                         r"no image is left for the test split; put at least 2 "
                                         r"images in a class folder"):
        load_dataset(str(root))


def test_image_folder_with_and_without_split(tmp_path):
    root = tmp_path / "flat"
    for cls, value in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
        for i in range(4):
            _png(root / cls / f"{i}.png", value)
    ds = load_dataset(str(root), seed=3)
    assert ds.class_names == ("cat", "dog")
    assert ds.x_train.shape == (6, 4, 6, 3) and len(ds.x_test) == 2
    assert sorted(ds.y_test.tolist()) == [0, 1]  # stratified: one test image per class
    cats = ds.x_train[ds.y_train == 0]
    assert np.all(cats[..., 0] == 1.0) and np.all(cats[..., 2] == 0.0)
    assert load_dataset(str(root), seed=3).y_test.tolist() == ds.y_test.tolist()

    split = tmp_path / "split"
    for part, n in (("train", 3), ("test", 1)):
        for cls in ("a", "b", "c"):
            for i in range(n):
                _png(split / part / cls / f"{i}.png", 128, mode="L")
    ds = load_dataset(str(split))
    assert ds.input_shape == (4, 6, 1) and ds.y_test.tolist() == [0, 1, 2]
    _png(split / "test" / "a" / "big.png", 0, size=(7, 7), mode="L")
    with pytest.raises(ValueError, match=r"big.png: is 7x7 pixels but the other images are 6x4"):
        load_dataset(str(split))


def test_directory_of_nothing_and_unknown_name(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="a directory must hold the IDX files"):
        load_dataset(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="unknown dataset 'imagenet': expected one of digits, "
                                         "mnist, fashion_mnist, cifar10, cifar100, svhn"):
        load_dataset("imagenet")
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_dataset(str(tmp_path / "missing.tar.gz"))


# ------------------------------------------------------------------------------- downloads

class _FakeServer:
    """``http_get`` stand-in: serves ``payload``; ``fail_after`` bytes then a reset, or offline."""

    def __init__(self, payload, fail_after=None, offline=False, announce=None):
        self.payload, self.fail_after, self.offline, self.announce = (
            payload, fail_after, offline, announce)
        self.calls = 0

    def __call__(self, url):
        self.calls += 1
        if self.offline:
            raise urllib.error.URLError(OSError(-3, "Temporary failure in name resolution"))

        def chunks():
            cut = len(self.payload) if self.fail_after is None else self.fail_after
            for i in range(0, cut, 64):
                yield self.payload[i:min(i + 64, cut)]
            if self.fail_after is not None:
                raise ConnectionResetError(104, "Connection reset by peer")

        return (self.announce or len(self.payload)), chunks()


@pytest.fixture
def remote_cifar(monkeypatch, cache):
    """cifar10 served by a fake fetch: (archive bytes, expected arrays, install(server))."""
    monkeypatch.delenv("ROBUSTGRAD_NO_DOWNLOAD", raising=False)
    archive, expect = _cifar10_archive()
    remote = _download.RemoteFile("cifar-10-binary.tar.gz", "https://data.invalid/c10.tgz", "md5",
                                  hashlib.md5(archive).hexdigest(), len(archive))
    monkeypatch.setitem(data._REMOTE_FILES, "cifar10", (remote,))

    def install(server):
        monkeypatch.setattr(_download, "http_get", server)
        return server

    return archive, expect, install


def _cache_files(cache):
    return sorted(p.name for p in cache.rglob("*")) if cache.exists() else []


def test_download_refused_when_asked(remote_cifar, cache, monkeypatch):
    archive, _, install = remote_cifar
    server = install(_FakeServer(archive))
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("cifar10", download=False)
    msg = str(err.value)
    assert "\n" not in msg and "https://data.invalid/c10.tgz" in msg
    assert str(cache / "cifar-10-binary.tar.gz") in msg and server.calls == 0
    monkeypatch.setenv("ROBUSTGRAD_NO_DOWNLOAD", "1")
    with pytest.raises(FileNotFoundError, match="downloads are off"):
        load_dataset("cifar10")
    assert server.calls == 0


def test_half_way_failure_leaves_nothing_and_the_next_call_retries(remote_cifar, cache):
    archive, expect, install = remote_cifar
    install(_FakeServer(archive, fail_after=len(archive) // 2))
    with pytest.raises(OSError, match="could not download https://data.invalid/c10.tgz "
                                      r"\(\[Errno 104\] Connection reset by peer\).*put it at"):
        load_dataset("cifar10", progress=False)
    assert _cache_files(cache) == []  # not even the temporary .part file
    # the server announces more bytes than it sends: also refused, also nothing kept
    install(_FakeServer(archive[:1000], announce=len(archive)))
    with pytest.raises(OSError, match="stopped at 1000 of"):
        load_dataset("cifar10", progress=False)
    # a wrong file (a captive portal's page) of the right size: checksum refused
    install(_FakeServer(bytes(len(archive))))
    with pytest.raises(OSError, match="has md5 .*, expected .*nothing was saved"):
        load_dataset("cifar10", progress=False)
    assert _cache_files(cache) == []
    server = install(_FakeServer(archive))
    ds = load_dataset("cifar10")  # with the progress display (quiet: stderr is not a terminal)
    assert server.calls == 1 and ds.y_test.tolist() == expect["y_test"].tolist()
    assert (cache / "cifar-10-binary.tar.gz").read_bytes() == archive
    load_dataset("cifar10", progress=False)
    assert server.calls == 1  # cached: not fetched again


def test_offline_machine_gets_one_line_saying_which_file_where(remote_cifar, cache):
    archive, _, install = remote_cifar
    install(_FakeServer(archive, offline=True))
    with pytest.raises(OSError) as err:
        load_dataset("cifar10", progress=False)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("--data cifar10: could not download https://data.invalid/c10.tgz")
    assert f"put it at {cache / 'cifar-10-binary.tar.gz'}" in msg
    assert _cache_files(cache) == []


def test_published_files_are_complete():
    assert set(data._REMOTE_FILES) == set(data.DATASETS) - {"digits"}
    for files in data._REMOTE_FILES.values():
        for f in files:
            assert len(f.digest) == {"md5": 32, "sha256": 64}[f.algorithm], f
            assert f.url.startswith(("https://", "http://ufldl.stanford.edu/"))


def test_uint8_npz_pixels_are_scaled_to_the_unit_box_and_float_npz_keep_their_range(tmp_path):
    """An .npz of 8-bit pixels (as the shared MNIST subset is stored) comes back in [0, 1] like
    every other 8-bit source, so that eps 0.3 means 0.3 of the pixel range, not 0.3/255."""
    from attacks.data import load_dataset, load_test_set

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (6, 4, 4), dtype=np.uint8)
    x[0, 0, 0], x[1, 0, 0] = 0, 255
    y = np.arange(6) % 3
    np.savez(tmp_path / "u8.npz", x_train=x, y_train=y, x_test=x[:3], y_test=y[:3])
    ds = load_dataset(str(tmp_path / "u8.npz"))
    assert (ds.clip_min, ds.clip_max) == (0.0, 1.0)
    np.testing.assert_allclose(ds.x_train[..., 0], x / 255.0, atol=1e-7)
    xt, _, _, _ = load_test_set(str(tmp_path / "u8.npz"))
    np.testing.assert_allclose(xt[..., 0], x[:3] / 255.0, atol=1e-7)
    np.savez(tmp_path / "bare.npz", x=x, y=y)
    xb, _, lo, hi = load_test_set(str(tmp_path / "bare.npz"))
    assert xb.max() == 1.0 and (lo, hi) == (None, None)
    xf = x.astype(np.float32)  # floats keep their values and report their own range
    np.savez(tmp_path / "f.npz", x_train=xf, y_train=y, x_test=xf[:3], y_test=y[:3])
    ds = load_dataset(str(tmp_path / "f.npz"))
    assert (ds.clip_min, ds.clip_max) == (0.0, 255.0)
