"""robustgrad.bounds._patches: CROWN's convolutional intermediate bounds by patches.

The patch pass must give the dense pass's bounds (the same sums in another order: 1e-12 in
float64, float32 rounding in float32) on every rule it takes (strides, "same"/"valid" padding,
zero padding, batch norm, residual adds with unequal windows, average pooling, non-square
kernels), be sound by sampling, and be refused where a rule has no patch form.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_bounds import (
    MODELS,
    _assert_contains,
    _box,
    _eager_bounds,
    _outputs,
    _randomize,
    _samples,
)

from robustgrad.bounds import (
    BoundedModel,
    _engine,
    _patches,
    _rules,
    compute_ball_bounds,
    margin_spec,
)
from robustgrad.bounds._keras_graph import Graph

L = keras.layers


def patch_model():
    """Every rule with a patch form: zero padding, a strided "valid" convolution, batch norm, a
    residual block (3x3 and 3x2 "same" kernels: the branches' windows differ), average pooling,
    a strided "same" convolution with asymmetric padding."""
    inp = keras.Input((12, 12, 2))
    h = L.ZeroPadding2D(1)(inp)
    h = L.Conv2D(4, 3, strides=2)(h)
    h = L.ReLU()(L.BatchNormalization()(h))
    r = L.Conv2D(4, 3, padding="same", activation="relu")(h)
    r = L.Conv2D(4, (3, 2), padding="same")(r)
    h = L.ReLU()(L.Add()([h, r]))
    h = L.AveragePooling2D(2)(h)
    h = L.Conv2D(5, 2, strides=2, padding="same", activation="relu")(h)
    return _randomize(keras.Model(inp, L.Dense(3)(L.Flatten()(h))), seed=9)


PATCH_MODELS = {"patch": patch_model, **{k: MODELS[k] for k in ("conv", "pool-bn",
                                                                "conv-residual", "classifier")}}


def _graph_and_boxes(model, dtype, eps=0.1):
    lo, hi = _box(model.input_shape[1:], eps, batch=4)
    lo, hi = tf.constant(lo.astype(dtype)), tf.constant(hi.astype(dtype))
    graph = Graph(model)
    boxes = _engine.interval_pass(graph, lo, hi, lo.dtype)
    return graph, boxes, [tuple(b[0].shape[1:]) for b in boxes]


@pytest.fixture
def pure_crown(monkeypatch):
    """CROWN's intermediate bounds alone (not intersected with IBP's): every difference shows."""
    monkeypatch.setattr(_engine, "INTERSECT_WITH_IBP", False)


@pytest.mark.parametrize("name", sorted(PATCH_MODELS))
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float32", 2e-6)])
def test_patches_give_the_dense_intermediate_bounds(name, dtype, tol, pure_crown, monkeypatch):
    graph, boxes, shapes = _graph_and_boxes(PATCH_MODELS[name](), dtype)
    bounds = {}
    for patches in (False, True):
        monkeypatch.setattr(_engine, "PATCHES", patches)
        bounds[patches] = _engine.pre_activation_bounds(graph, boxes, shapes, None,
                                                        boxes[0][0].dtype, "crown")
    patched = [n for n in bounds[True] if n and _patches.plan(graph, n, shapes) is not None]
    assert patched  # the patch pass ran
    refined = 0
    for node in bounds[True]:
        for a, b, ibp in zip(bounds[True][node], bounds[False][node], boxes[node]):
            scale = 1 + np.abs(b.numpy())
            np.testing.assert_array_less(np.abs(a.numpy() - b.numpy()), tol * scale)
            refined += int(np.sum(np.abs(b.numpy() - ibp.numpy()) > 1e-3))
    assert refined > 0  # CROWN changed intermediate bounds: the relaxations were exercised


# the models on which the default (PATCHES None) takes patches wherever they have a plan (checked
# in test_default_takes_every_patch_plan): test_bounds.py samples their CROWN bounds by patches
DEFAULT_PATCHED = ("classifier", "conv-residual", "pool-bn")


@pytest.mark.parametrize("name", sorted(set(PATCH_MODELS) - set(DEFAULT_PATCHED)))
def test_patch_bounds_are_sound_by_sampling(name, monkeypatch):
    # the logits' bounds (float32); a margin spec's bounds by patches are sampled in
    # test_transpose_by_forward_convolution_gives_the_same_bounds (float64, the same boxes)
    monkeypatch.setattr(_engine, "PATCHES", True)
    model = PATCH_MODELS[name]()
    lower, upper = _box(model.input_shape[1:], eps=0.15)
    values = _outputs(model, _samples(lower, upper, n=1000))
    lb, ub = BoundedModel(model).bounds(lower, upper, "crown")
    _assert_contains(lb.numpy(), ub.numpy(), values)


def test_patches_over_an_l2_ball_give_the_dense_bounds(pure_crown, monkeypatch):
    model = patch_model()
    x = np.random.default_rng(1).uniform(0.2, 0.8, (3, 12, 12, 2)).astype(np.float64)
    out = {}
    for patches in (False, True):
        monkeypatch.setattr(_engine, "PATCHES", patches)
        out[patches] = compute_ball_bounds(model, x, 0.5, norm="l2", method="crown",
                                           clip_min=0.0, clip_max=1.0)
    for a, b in zip(out[True], out[False]):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-12)


def test_plan_windows_and_refusals():
    graph = Graph(patch_model())
    one = tf.zeros([1, 12, 12, 2])
    shapes = [tuple(b[0].shape[1:]) for b in _engine.interval_pass(graph, one, one, tf.float32)]
    # the first convolution's output (node 2, after the zero padding): its 3x3 window of the
    # padded input is the input's window starting one row and column before, stride 2
    geo = _patches.plan(graph, 2, shapes)
    assert geo[0] == _patches.Geometry(1, 1, 3, 3, 2, 2)
    # the residual add (node 8): the 3x2 kernel's branch widens the window to the right only
    geo = _patches.plan(graph, 8, shapes)
    assert geo[3] == _patches.Geometry(2, 1, 5, 4, 1, 1)
    # the output (after Flatten and Dense) has no patch form
    assert _patches.plan(graph, graph.output, shapes) is None
    # max pooling on the way: none either
    pooled = Graph(MODELS["max-pooling"]())
    one = tf.zeros([1, 9, 9, 2])
    pshapes = [tuple(b[0].shape[1:]) for b in _engine.interval_pass(pooled, one, one, tf.float32)]
    kinds = [type(r).__name__ for r in pooled.rules]
    after_pool = kinds.index("Conv2D", kinds.index("MaxPooling2D"))
    assert _patches.plan(pooled, after_pool, pshapes) is None
    assert _patches.plan(pooled, 1, pshapes) is not None


def test_default_takes_every_patch_plan():
    """On DEFAULT_PATCHED, every node with a plan is worth patches: the default computes what
    PATCHES=True does, and test_bounds_are_sound_by_sampling_for_every_method samples it."""
    for name in DEFAULT_PATCHED:
        graph, _, shapes = _graph_and_boxes(PATCH_MODELS[name](), "float32")
        plans = {n: _patches.plan(graph, n, shapes) for n in range(1, len(graph.rules))}
        plans = {n: g for n, g in plans.items() if g is not None}
        assert plans and all(_patches.worth_it(g, shapes, n) for n, g in plans.items()), name
    graph, _, shapes = _graph_and_boxes(PATCH_MODELS["conv"](), "float32")
    assert not all(_patches.worth_it(g, shapes, n) for n in range(1, len(graph.rules))
                   if (g := _patches.plan(graph, n, shapes)) is not None)  # sampled here


@pytest.mark.parametrize("name", ["patch", "classifier"])
def test_sparse_intermediate_bounds_lose_nothing(name, monkeypatch):
    # only the unstable ReLUs (and the elements a max pooling may pick) get intermediate CROWN
    # passes; every element's pass changes no output bound, and costs more rows
    model = PATCH_MODELS[name]()
    lower, upper = _box(model.input_shape[1:], eps=0.1)
    lower, upper = lower.astype(np.float64), upper.astype(np.float64)
    spec = margin_spec([0, 1, 2], model.output_shape[-1], dtype=tf.float64)
    out, graph = {}, Graph(model)
    for sparse in (False, True):
        monkeypatch.setattr(_engine, "SPARSE_INTERMEDIATE", sparse)
        out[sparse] = _eager_bounds(graph, lower, upper, "crown", spec)
    for a, b in zip(out[True], out[False]):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-12)
    graph, boxes, _ = _graph_and_boxes(model, "float64")
    masks = [_engine._refine_mask(graph, graph.inputs[i][0], boxes)
             for i, r in enumerate(graph.rules) if r is not None and not r.linear]
    counts = [(int(tf.reduce_sum(tf.cast(m, tf.int32))), m.shape.num_elements()) for m in masks]
    assert any(0 < k < n for k, n in counts), counts  # some elements skipped, some refined


def _same_forward_convolutions(model):
    """The names of the convolutions whose transpose ``TRANSPOSE="same"`` computes forward
    (stride 1, "same", odd kernel, at least ``SAME_MIN_CHANNELS`` input channels)."""
    return [layer.name for layer in model.layers if isinstance(layer, L.Conv2D)
            and tuple(layer.strides) == (1, 1) and layer.padding == "same"
            and all(k % 2 == 1 for k in layer.kernel_size)
            and layer.kernel.shape[2] >= _rules.SAME_MIN_CHANNELS]


@pytest.mark.parametrize("name", sorted(PATCH_MODELS))
def test_transpose_by_forward_convolution_gives_the_same_bounds(name, monkeypatch):
    """A convolution's transpose computed as a forward convolution with the flipped kernel (by
    phases for a stride; or only where it is one "same" convolution): the same sums, so the same
    bounds as TensorFlow's transposed convolution, by patches and densely, and sound by
    sampling."""
    model = PATCH_MODELS[name]()
    lower, upper = _box(model.input_shape[1:], eps=0.15)
    lower, upper = lower.astype(np.float64), upper.astype(np.float64)
    spec = margin_spec([0, 1, 2], model.output_shape[-1], dtype=tf.float64)
    # "same" differs from "native" only on a convolution it computes forward (the classifier's
    # third): elsewhere it is "native" again. CROWN-IBP's pre-activation bounds are IBP's, so
    # PATCHES (read by CROWN's intermediate passes alone) does not change its computation
    same = _same_forward_convolutions(model)
    assert bool(same) == (name == "classifier"), same
    out, graph = {}, Graph(model)
    for how in ("native", "forward") + (("same",) if same else ()):
        monkeypatch.setattr(_rules, "TRANSPOSE", how)
        for patches, method in ((False, "crown"), (True, "crown"), (False, "crown-ibp")):
            monkeypatch.setattr(_engine, "PATCHES", patches)
            out[how, patches, method] = _eager_bounds(graph, lower, upper, method, spec)
    for key, (lb, ub) in out.items():
        if key[0] != "native":
            ref = out[("native", *key[1:])]
            np.testing.assert_allclose(lb.numpy(), ref[0].numpy(), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(ub.numpy(), ref[1].numpy(), rtol=1e-12, atol=1e-12)
    values = np.einsum("bsk,bmk->bms", spec.numpy(),
                       _outputs(model, _samples(lower.astype(np.float32),
                                                upper.astype(np.float32), n=1000)))
    for key, (lb, ub) in out.items():
        if key[0] != "native":
            _assert_contains(lb.numpy(), ub.numpy(), values)
