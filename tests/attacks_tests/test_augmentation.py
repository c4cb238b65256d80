"""The standard augmentation of attacks.training.data: pad-and-random-crop and horizontal flip,
on the fly, deterministic under a seed, replayed exactly on resume."""

import numpy as np
import pytest
import tensorflow as tf

from attacks import training
from attacks.training import augment_dataset, epoch_dataset, random_crop_flip


def _images(n=16, size=6, channels=2, seed=0):
    # strictly positive values, so zero padding is recognisable
    return np.random.default_rng(seed).uniform(0.1, 1.0, (n, size, size, channels)).astype("float32")


def _window_offsets(x, out, pad, allow_flip):
    """For each image, the (dy, dx, flipped) that produce ``out`` from ``x`` padded with zeros;
    an assertion error when none does."""
    h, w = x.shape[1:3]
    padded = np.pad(x, [(0, 0), (pad, pad), (pad, pad), (0, 0)])
    found = []
    for i in range(len(x)):
        hits = [(dy, dx, f) for dy in range(2 * pad + 1) for dx in range(2 * pad + 1)
                for f in ((False, True) if allow_flip else (False,))
                if np.array_equal(out[i], (padded[i, dy:dy + h, dx:dx + w][:, ::-1] if f else
                                           padded[i, dy:dy + h, dx:dx + w]))]
        assert hits, f"image {i} is not a {2 * pad + 1}x{2 * pad + 1} window of its padded input"
        found.append(hits[0])
    return found


def test_crop_is_a_window_of_the_padded_image_and_offsets_vary():
    x = _images(32)
    out = random_crop_flip(x, [3, 4], pad=2, flip=False).numpy()
    assert out.shape == x.shape and out.dtype == np.float32
    offsets = _window_offsets(x, out, 2, allow_flip=False)
    assert len({(dy, dx) for dy, dx, _ in offsets}) > 5  # 25 possible offsets
    assert any((dy, dx) != (2, 2) for dy, dx, _ in offsets)


def test_flip_mirrors_about_half_the_images_and_identity_without_either():
    x = _images(200, channels=1)
    np.testing.assert_array_equal(random_crop_flip(x, [0, 1], pad=0, flip=False).numpy(), x)
    out = random_crop_flip(x, [0, 1], pad=0, flip=True).numpy()
    flipped = [np.array_equal(o, xi[:, ::-1]) for o, xi in zip(out, x)]
    kept = [np.array_equal(o, xi) for o, xi in zip(out, x)]
    assert all(f or k for f, k in zip(flipped, kept))
    assert 70 < sum(flipped) < 130


def test_reflect_padding_never_shows_a_border_and_input_is_untouched():
    x = _images(16)
    before = x.copy()
    out = random_crop_flip(x, [5, 5], pad=3, pad_mode="reflect").numpy()
    assert out.min() >= 0.1  # every pixel comes from the image
    np.testing.assert_array_equal(x, before)
    zero = random_crop_flip(x, [5, 5], pad=3).numpy()
    assert zero.min() == 0.0  # constant padding shows zeros somewhere in 16 crops


def test_same_seed_same_batches_different_seed_different():
    x = _images(20)
    y = np.arange(20)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)

    def run(seed, dataset=ds):
        return [(a.numpy(), b.numpy()) for a, b in augment_dataset(dataset, pad=2, seed=seed)]

    first, again, other = run(1), run(1), run(2)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(first, again))
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(first, other))
    assert [b.tolist() for _, b in first] == [list(range(0, 8)), list(range(8, 16)),
                                             list(range(16, 20))]  # labels pass through
    for (xa, _), xs in zip(first, (x[:8], x[8:16], x[16:])):
        _window_offsets(xs, xa, 2, allow_flip=True)
    # after repeat(), the second epoch gets new augmentations
    two = [a.numpy() for a, _ in augment_dataset(ds.repeat(2), pad=2, seed=1)]
    assert not np.array_equal(two[0], two[3])


def test_unbatched_images_and_image_only_datasets():
    x = _images(4)
    single = list(augment_dataset(tf.data.Dataset.from_tensor_slices(x), pad=1, seed=0))
    assert [s.shape for s in single] == [(6, 6, 2)] * 4
    _window_offsets(x, np.stack([s.numpy() for s in single]), 1, allow_flip=True)


def test_epoch_dataset_flip_and_shift_replay_on_resume():
    x = _images(20)
    y = np.arange(20)
    full = [a.numpy() for a, _ in epoch_dataset(x, y, 8, seed=3, epochs=3, shift=2, flip=True)]
    resumed = [a.numpy() for a, _ in epoch_dataset(x, y, 8, seed=3, first_epoch=1, epochs=3,
                                                   shift=2, flip=True, skip_batches=1)]
    assert len(full) == 9 and len(resumed) == 5
    assert all(np.array_equal(a, b) for a, b in zip(full[4:], resumed))
    labels = [b.numpy() for _, b in epoch_dataset(x, y, 8, seed=3, epochs=1)]
    _window_offsets(x[labels[0]], full[0], 2, allow_flip=True)
    plain = [a.numpy() for a, _ in epoch_dataset(x, y, 8, seed=3, epochs=1, shift=2)]
    assert not all(np.array_equal(a, b) for a, b in zip(plain, full[:3]))  # flip changed some


@pytest.mark.parametrize("call, match", [
    (lambda: random_crop_flip(np.zeros((2, 4, 4, 1)), [0, 0], pad=-1), "pad"),
    (lambda: random_crop_flip(np.zeros((2, 4, 4, 1)), [0, 0], pad_mode="wrap"), "pad_mode"),
    (lambda: random_crop_flip(np.zeros((4, 4)), [0, 0]), r"\[b, H, W, C\]"),
    (lambda: random_crop_flip(np.zeros((2, 4, 4, 1)), [0, 0], pad=4, pad_mode="reflect"),
     "pad < the image size"),
    (lambda: augment_dataset(np.zeros((2, 4, 4, 1))), "tf.data.Dataset"),
    (lambda: augment_dataset(tf.data.Dataset.range(3)), "images"),
    (lambda: augment_dataset(tf.data.Dataset.from_tensors(np.zeros((1, 4, 4, 1))), flip=1),
     "flip"),
    (lambda: training.epoch_dataset(np.zeros((4, 3)), np.zeros(4), 2, flip=True),
     r"\[N, H, W, C\]"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
