"""attacks.training.architectures: shapes, the published parameter counts (built, not trained),
.keras round trips without custom objects, mixed precision, normalisation inside the model, and
clear errors for unknown names, options and input shapes."""

import keras
import numpy as np
import pytest

import attacks
from attacks import training
from attacks.training import ARCHITECTURES, make_model


def _trainable(model):
    return sum(int(np.prod(v.shape)) for v in model.trainable_weights)


@pytest.mark.parametrize("arch, expected", [
    # Rice et al. 2020 / Wong et al. 2020's PreActResNet18 (final BN included): 11.17M
    ("preactresnet18", 11_172_170),
    ("wrn-28-10", 36_479_194),  # Zagoruyko & Komodakis 2016, Madry et al.'s CIFAR-10 model
    ("wrn-34-10", 46_160_474),  # TRADES's model
])
def test_published_parameter_counts(arch, expected):
    model = make_model(arch, (32, 32, 3), 10)
    assert _trainable(model) == expected
    assert model.output_shape == (None, 10)
    keras.backend.clear_session()


@pytest.mark.parametrize("arch, shape, options", [
    ("cnn", (28, 28, 1), {"width": 4}),
    ("mlp", (28, 28, 1), {"hidden": (16, 8)}),
    ("mlp", (20,), {}),
    ("preactresnet18", (32, 32, 3), {"width": 4}),
    ("preactresnet18", (28, 28), {"width": 2}),  # MNIST-sized: 28 -> 14 -> 7 -> 4
    ("wideresnet", (32, 32, 3), {"depth": 10, "widen_factor": 2, "dropout": 0.3}),
    ("WRN-16-1", (16, 16, 3), {}),
])
def test_shapes_and_logits(arch, shape, options):
    model = make_model(arch, shape, 7, **options)
    x = np.random.default_rng(0).random((3, *shape), dtype="float32")
    if len(shape) == 2:
        x = x[..., None]
    out = model(x, training=False).numpy()
    assert out.shape == (3, 7) and out.dtype == np.float32
    assert not np.allclose(out[0], out[1])  # depends on the input


def test_keras_round_trip_without_custom_objects(tmp_path):
    x = np.random.default_rng(1).random((4, 16, 16, 3), dtype="float32")
    for arch, options in (("preactresnet18", {"width": 4}), ("wrn-10-2", {}), ("cnn", {"width": 4}),
                          ("mlp", {"hidden": (8,)})):
        model = make_model(arch, (16, 16, 3), 10, mean=(0.5, 0.4, 0.3), std=0.25, **options)
        model(x, training=True)  # move the batch-norm statistics away from their initial values
        path = tmp_path / f"{arch}.keras"
        model.save(path)
        loaded = keras.models.load_model(path)  # no custom_objects
        np.testing.assert_allclose(loaded(x, training=False).numpy(),
                                   model(x, training=False).numpy(),
                                   rtol=1e-5, atol=1e-5, err_msg=arch)
        assert loaded.get_layer("normalize") is not None


def test_normalisation_inside_the_model_is_x_minus_mean_over_std():
    mean, std = np.array([0.1, 0.2, 0.3], "float32"), np.array([0.5, 0.25, 2.0], "float32")
    with_norm = make_model("preactresnet18", (8, 8, 3), 10, width=2, mean=mean, std=std)
    plain = make_model("preactresnet18", (8, 8, 3), 10, width=2)
    for layer in plain.layers:
        if layer.weights:
            layer.set_weights(with_norm.get_layer(layer.name).get_weights())
    x = np.random.default_rng(2).random((5, 8, 8, 3), dtype="float32")
    np.testing.assert_allclose(with_norm(x, training=False).numpy(),
                               plain((x - mean) / std, training=False).numpy(),
                               rtol=1e-4, atol=1e-5)


def test_mixed_precision_gives_float32_logits():
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        for arch in ("preactresnet18", "wrn-10-1", "cnn", "mlp"):
            model = make_model(arch, (8, 8, 3), 10, mean=0.5, std=0.5,
                               **({"width": 2} if arch in ("preactresnet18", "cnn") else {}))
            conv_like = [la for la in model.layers if isinstance(la, (keras.layers.Conv2D,
                                                                      keras.layers.Dense))]
            assert conv_like[0].compute_dtype == "float16"  # the body really runs in float16
            assert model.get_layer("normalize").compute_dtype == "float32"
            out = model(np.ones((2, 8, 8, 3), "float32"), training=False).numpy()
            assert out.dtype == np.float32 and np.all(np.isfinite(out)), arch
    finally:
        keras.mixed_precision.set_global_policy(previous)


def test_registry_and_exports():
    assert list(ARCHITECTURES) == ["cnn", "mlp", "ibp-small", "preactresnet18", "wideresnet",
                                   "wrn-28-10", "wrn-34-10"]
    assert attacks.make_model is training.make_model and attacks.ARCHITECTURES is ARCHITECTURES
    # the cnn is make_classifier's network: same layers, same parameter count
    assert _trainable(make_model("cnn", (8, 8, 1), 10, width=4)) == _trainable(
        training.make_classifier((8, 8, 1), 10, width=4))


@pytest.mark.parametrize("call, error, match", [
    (lambda: make_model("resnet50", (32, 32, 3), 10), ValueError,
     "arch must be one of cnn, mlp, ibp-small, preactresnet18, wideresnet, wrn-28-10, wrn-34-10"),
    (lambda: make_model(None, (32, 32, 3), 10), TypeError, "arch must be a name"),
    (lambda: make_model("preactresnet18", (784,), 10), ValueError,
     r"input_shape \(784,\): preactresnet18 takes images .*arch='mlp'"),
    (lambda: make_model("preactresnet18", (4, 4, 3), 10), ValueError,
     "halves the image 3 times and needs at least 8x8 pixels"),
    (lambda: make_model("wrn-28-10", (2, 2, 3), 10), ValueError, "at least 4x4"),
    (lambda: make_model("cnn", (8, 0, 1), 10), ValueError, "positive sizes"),
    (lambda: make_model("wrn-27-10", (32, 32, 3), 10), ValueError, "depth must be 6n \\+ 4"),
    (lambda: make_model("preactresnet18", (32, 32, 3), 10, depth=18), TypeError,
     "has no option depth; its options are width, mean, std, name"),
    (lambda: make_model("wrn-28-10", (32, 32, 3), 10, depth=34), TypeError, "no option depth"),
    (lambda: make_model("cnn", (32, 32, 3), 1), ValueError, "num_classes must be an int >= 2"),
    (lambda: make_model("mlp", (8, 8, 3), 10, mean=(0.1, 0.2)), ValueError,
     "mean must be a finite number or 3 numbers"),
    (lambda: make_model("mlp", (8, 8, 3), 10, std=0.0), ValueError, "std must be > 0"),
    (lambda: make_model("wideresnet", (32, 32, 3), 10, dropout=1.0), ValueError, "dropout"),
])
def test_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_images_of_another_size_and_labels_outside_the_classes_are_refused():
    model = make_model("preactresnet18", (32, 32, 3), 10, width=2)
    with pytest.raises(ValueError, match=r"the data's examples have shape \(28, 28, 1\) but the "
                                         r"model takes inputs of shape \(32, 32, 3\)"):
        training.check_classifier(model, np.zeros((2, 28, 28, 1), "float32"), 10)
    with pytest.raises(ValueError, match="the labels have 100 classes but the model outputs 10"):
        training.check_classifier(model, np.zeros((2, 32, 32, 3), "float32"), 100)


def test_a_resnet_trains_adversarially_on_augmented_cifar_shaped_batches(tmp_path):
    """End to end on synthetic 16x16x3 data: PreActResNet (narrow) with normalisation inside,
    pad-crop-flip batches, two Madry steps; the weights and the batch-norm statistics move, the
    loss is finite, and the trained model round-trips through .keras."""
    rng = np.random.default_rng(0)
    x = rng.random((32, 16, 16, 3), dtype="float32")
    y = rng.integers(0, 10, 32)
    model = make_model("preactresnet18", (16, 16, 3), 10, width=4, mean=0.5, std=0.25)
    before = [w.numpy().copy() for w in model.weights]
    trainer = training.AdversarialTrainer(model, method="madry", eps=8 / 255, steps=2,
                                          eval_steps=0)
    trainer.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    ds = training.epoch_dataset(x, y, 16, epochs=1, shift=4, flip=True)
    history = trainer.fit(ds, epochs=1, steps_per_epoch=2, verbose=0)
    assert np.isfinite(history.history["loss"][-1])
    moved = {w.path for w, b in zip(model.weights, before) if not np.allclose(w.numpy(), b)}
    assert any("stem_conv" in p for p in moved) and any("moving_mean" in p for p in moved)
    assert not any("normalize" in p for p in moved)  # the statistics are constants
    model.save(tmp_path / "m.keras")
    np.testing.assert_allclose(keras.models.load_model(tmp_path / "m.keras")(x[:4]).numpy(),
                               model(x[:4]).numpy(), rtol=1e-5, atol=1e-5)
