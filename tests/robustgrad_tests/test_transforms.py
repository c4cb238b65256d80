"""Tests for robustgrad.transforms: hand-computed values, composition, GradientStep."""

import doctest

import keras
import numpy as np
import pytest
import tensorflow as tf

from robustgrad import transforms


def _np(tree):
    return [np.asarray(x) for x in tf.nest.flatten(tree)]


def _run(t, grads, params=None, steps=1):
    params = grads if params is None else params
    state = t.init(params)
    for _ in range(steps):
        out, state = t.update(grads, state, params)
    return out, state


def test_docstring_examples():
    result = doctest.testmod(transforms, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


# ---------------------------------------------------------------- values


def test_clip_by_value():
    g = [tf.constant([-3.0, 0.5, 2.0]), tf.constant([[10.0]])]
    out, _ = _run(transforms.clip_by_value(1.0), g)
    np.testing.assert_allclose(out[0], [-1.0, 0.5, 1.0])
    np.testing.assert_allclose(out[1], [[1.0]])
    out, _ = _run(transforms.clip_by_value(2.0, min_value=0.0), g)
    np.testing.assert_allclose(out[0], [0.0, 0.5, 2.0])


def test_clip_by_norm_is_per_tensor():
    g = {"a": tf.constant([3.0, 4.0]), "b": tf.constant([0.3, 0.4])}
    out, _ = _run(transforms.clip_by_norm(1.0), g)
    np.testing.assert_allclose(out["a"], [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(out["b"], [0.3, 0.4], rtol=1e-6)  # norm 0.5 < 1: untouched
    out, _ = _run(transforms.clip_by_norm(0.0), g)
    np.testing.assert_allclose(out["a"], [0.0, 0.0])


def test_clip_by_global_norm():
    g = [tf.constant([3.0]), tf.constant([[4.0]], tf.float64)]  # global norm 5
    out, _ = _run(transforms.clip_by_global_norm(2.5), g)
    np.testing.assert_allclose(out[0], [1.5], rtol=1e-6)
    np.testing.assert_allclose(out[1], [[2.0]], rtol=1e-6)
    assert out[1].dtype == tf.float64
    out, _ = _run(transforms.clip_by_global_norm(10.0), g)
    np.testing.assert_allclose(out[0], [3.0])


def test_adaptive_clip_unitwise():
    # Dense kernel (in=2, out=2): unit norms over axis 0. W col0 norm 5, col1 norm 0 -> eps.
    w = tf.constant([[3.0, 0.0], [4.0, 0.0]])
    g = tf.constant([[30.0, 1.0], [40.0, 0.0]])
    b = tf.constant([1.0, 1.0])     # bias: whole-tensor norm sqrt(2)
    gb = tf.constant([0.01, 0.01])  # ratio 0.01 < 0.1: untouched
    out, _ = _run(transforms.adaptive_clip(0.1, eps=1e-3), [g, gb], params=[w, b])
    # column 0: ||G||=50 > 0.1*5 -> scaled to norm 0.5; column 1: max(0, eps)=1e-3 -> norm 1e-4
    np.testing.assert_allclose(out[0][:, 0], [0.3, 0.4], rtol=1e-5)
    np.testing.assert_allclose(out[0][:, 1], [1e-4, 0.0], rtol=1e-4)
    np.testing.assert_allclose(out[1], [0.01, 0.01])
    # conv kernel (h, w, in, out): one norm per output channel
    wc = tf.ones((3, 3, 2, 4))
    gc = tf.ones((3, 3, 2, 4)) * 100.0
    out, _ = _run(transforms.adaptive_clip(0.5), [gc], params=[wc])
    norms = np.sqrt((np.asarray(out[0]) ** 2).sum(axis=(0, 1, 2)))
    np.testing.assert_allclose(norms, 0.5 * np.sqrt(18.0) * np.ones(4), rtol=1e-5)


def test_zero_nonfinite():
    g = [tf.constant([1.0, np.nan, np.inf, -np.inf])]
    out, _ = _run(transforms.zero_nonfinite(), g)
    np.testing.assert_array_equal(out[0], [1.0, 0.0, 0.0, 0.0])


def test_chain_order_matters():
    g = [tf.constant([3.0, 4.0])]
    # clip value to 1 then global norm 1: [1,1] -> [0.7071, 0.7071]
    out, _ = _run(transforms.chain(transforms.clip_by_value(1.0), transforms.clip_by_global_norm(1.0)), g)
    np.testing.assert_allclose(out[0], [2 ** -0.5, 2 ** -0.5], rtol=1e-6)
    # global norm 1 then clip value 0.7: [0.6, 0.8] -> [0.6, 0.7]
    out, state = _run(transforms.chain(transforms.clip_by_global_norm(1.0), transforms.clip_by_value(0.7)), g)
    np.testing.assert_allclose(out[0], [0.6, 0.7], rtol=1e-6)
    assert isinstance(state, tuple) and len(state) == 2


def test_apply_if_finite_skips_and_counts():
    inner = transforms.accumulate(2)  # stateful inner: must not see rejected steps
    t = transforms.apply_if_finite(inner, max_consecutive_errors=1)
    params = [tf.zeros(2)]
    s = t.init(params)
    bad = [tf.constant([np.nan, 1.0])]
    good = [tf.constant([1.0, 3.0])]
    u, s = t.update(good, s)
    assert bool(s.last_finite) and int(s.notfinite_count) == 0
    assert int(s.inner_state.mini_step) == 1
    for i in (1, 2):
        u, s = t.update(bad, s)
        np.testing.assert_array_equal(u[0], [0.0, 0.0])
        assert not bool(s.last_finite)
        assert int(s.notfinite_count) == i
        assert int(s.inner_state.mini_step) == 1  # inner state untouched
        np.testing.assert_array_equal(s.inner_state.acc[0], [1.0, 3.0])
    assert int(s.total_notfinite) == 2
    assert not bool(transforms.should_apply(s))
    u, s = t.update([tf.constant([3.0, 5.0])], s)
    np.testing.assert_allclose(u[0], [2.0, 4.0])  # mean of the two finite micro-steps
    assert int(s.notfinite_count) == 0 and int(s.total_notfinite) == 2
    assert bool(transforms.should_apply(s))


def test_accumulate_mean_and_sum():
    g_seq = [[tf.constant([1.0, 2.0])], [tf.constant([3.0, 0.0])], [tf.constant([2.0, 4.0])]]
    t = transforms.accumulate(3)
    s = t.init([tf.zeros(2)])
    emits = []
    for g in g_seq:
        u, s = t.update(g, s)
        emits.append(bool(s.emit))
    assert emits == [False, False, True]
    np.testing.assert_allclose(u[0], [2.0, 2.0])
    assert int(s.mini_step) == 0
    np.testing.assert_array_equal(s.acc[0], [0.0, 0.0])
    t = transforms.accumulate(3, average=False)
    s = t.init([tf.zeros(2)])
    for g in g_seq:
        u, s = t.update(g, s)
    np.testing.assert_allclose(u[0], [6.0, 6.0])


def test_accumulate_inner_runs_on_emission_only():
    t = transforms.accumulate(2, inner=transforms.add_noise(0.0))
    s = t.init([tf.zeros(1)])
    for _ in range(4):
        _, s = t.update([tf.ones(1)], s)
    assert int(s.inner_state.count) == 2


def test_add_noise_variance_and_determinism():
    g = [tf.zeros((200, 200))]
    t = transforms.add_noise(2.0, decay=1.0, seed=3)
    s = t.init(g)
    u0, s = t.update(g, s)
    u1, s = t.update(g, s)
    np.testing.assert_allclose(np.var(u0[0]), 4.0, rtol=0.05)        # t=0: stddev^2
    np.testing.assert_allclose(np.var(u1[0]), 4.0 / 2.0, rtol=0.05)  # t=1: stddev^2 / 2^decay
    assert int(s.count) == 2
    again, _ = transforms.add_noise(2.0, decay=1.0, seed=3).update(g, transforms.add_noise(2.0).init(g))
    np.testing.assert_array_equal(again[0], u0[0])
    assert not np.allclose(u0[0], u1[0])


def test_masked_freezes_with_nest_and_callable():
    g = {"frozen": tf.constant([5.0]), "live": tf.constant([5.0, 0.0])}
    t = transforms.masked(transforms.clip_by_global_norm(1.0), {"frozen": False, "live": True})
    out, _ = _run(t, g)
    np.testing.assert_array_equal(out["frozen"], [0.0])
    np.testing.assert_allclose(out["live"], [1.0, 0.0])  # norm ignores the frozen leaf
    t = transforms.masked(transforms.clip_by_global_norm(1.0), {"frozen": False, "live": True},
                          passthrough=True)
    out, _ = _run(t, g)
    np.testing.assert_array_equal(out["frozen"], [5.0])

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="body"),
                              keras.layers.Dense(2, name="head")])
    vs = model.trainable_variables
    t = transforms.masked(transforms.identity(), lambda name: "head" in name)
    grads = [tf.ones_like(v) for v in vs]
    out, _ = _run(t, grads, params=vs)
    for v, o in zip(vs, out):
        assert np.all(np.asarray(o) == (1.0 if "head" in v.path else 0.0)), v.path


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("factory,arg", [
    (lambda: transforms.clip_by_value(-1.0), "max_value"),
    (lambda: transforms.clip_by_value(0.0, min_value=1.0), "min_value"),
    (lambda: transforms.clip_by_norm(-1.0), "max_norm"),
    (lambda: transforms.clip_by_global_norm(-0.5), "max_norm"),
    (lambda: transforms.adaptive_clip(-0.1), "clipping"),
    (lambda: transforms.adaptive_clip(0.1, eps=-1.0), "eps"),
    (lambda: transforms.accumulate(0), "k"),
    (lambda: transforms.add_noise(-1.0), "stddev"),
    (lambda: transforms.add_noise(1.0, decay=-1.0), "decay"),
    (lambda: transforms.apply_if_finite(transforms.identity(), -1), "max_consecutive_errors"),
])
def test_bad_arguments_raise_value_error(factory, arg):
    with pytest.raises(ValueError, match=arg):
        factory()


@pytest.mark.parametrize("factory,arg", [
    (lambda: transforms.clip_by_norm("1"), "max_norm"),
    (lambda: transforms.accumulate(1.5), "k"),
    (lambda: transforms.add_noise(1.0, seed=None), "seed"),
    (lambda: transforms.chain(transforms.identity(), "clip"), r"transforms\[1\]"),
    (lambda: transforms.apply_if_finite(lambda g: g), "inner"),
    (lambda: transforms.masked(transforms.identity(), [1, 0]), "mask"),
])
def test_bad_types_raise_type_error(factory, arg):
    with pytest.raises(TypeError, match=arg):
        factory()


def test_mismatched_structures_raise():
    t = transforms.accumulate(2)
    s = t.init([tf.zeros(2), tf.zeros(3)])
    with pytest.raises(ValueError, match="updates"):
        t.update([tf.zeros(2)], s)
    with pytest.raises(ValueError, match="params"):
        transforms.clip_by_norm(1.0).update([tf.zeros(2)], transforms.EmptyState(), params=[tf.zeros(2)] * 2)
    with pytest.raises(ValueError, match="mask"):
        transforms.masked(transforms.identity(), [True]).init([tf.zeros(1), tf.zeros(1)])
    with pytest.raises(ValueError, match="params"):
        transforms.adaptive_clip().update([tf.zeros(2)], transforms.EmptyState())
    with pytest.raises(TypeError, match="updates"):
        transforms.zero_nonfinite().update([tf.constant([1, 2])], transforms.EmptyState())


# ---------------------------------------------------------------- GradientStep


def _mlp():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3)])


def _grads(model, x, y):
    with tf.GradientTape() as tape:
        logits = model(x, training=False)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    return tape.gradient(loss, model.trainable_variables)


X = tf.random.stateless_normal((16, 4), seed=[1, 2])
Y = tf.constant(np.arange(16) % 3, tf.int32)


def test_gradient_step_rejects_without_moving_adam_moments():
    model = _mlp()
    opt = keras.optimizers.Adam(1e-2)
    step = transforms.GradientStep(transforms.apply_if_finite(transforms.clip_by_global_norm(1.0), 2), opt,
                                   model.trainable_variables)
    stats = step(_grads(model, X, Y))
    assert bool(stats["applied"]) and int(stats["nonfinite_steps"]) == 0
    before_w = [v.numpy().copy() for v in model.trainable_variables]
    before_opt = [v.numpy().copy() for v in opt.variables]
    bad = [g * np.nan for g in _grads(model, X, Y)]
    for i in (1, 2, 3):
        stats = step(bad)
        assert not bool(stats["applied"])
        assert int(stats["nonfinite_steps"]) == i
        assert bool(stats["nonfinite_exceeded"]) == (i > 2)
    for a, v in zip(before_w, model.trainable_variables):
        np.testing.assert_array_equal(a, v.numpy())
    for a, v in zip(before_opt, opt.variables):  # iterations, momentum, velocity unchanged
        np.testing.assert_array_equal(a, v.numpy())
    assert np.isnan(float(stats["grad_norm"]))
    assert int(step.nonfinite_steps) == 3
    assert int(step.state.max_consecutive_errors) == 2
    with pytest.raises(transforms.NonFiniteGradientError, match="max_consecutive_errors"):
        step.raise_if_exceeded(stats)
    with pytest.raises(ValueError, match="max_consecutive_errors"):
        step.raise_if_exceeded()
    stats = step(_grads(model, X, Y))
    assert bool(stats["applied"]) and int(stats["nonfinite_steps"]) == 0
    assert int(opt.iterations) == 2


def test_gradient_step_accumulate_equals_mean_gradient():
    m1, m2 = _mlp(), _mlp()
    o1, o2 = keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)
    s1 = transforms.GradientStep(transforms.accumulate(2), o1, m1.trainable_variables)
    s2 = transforms.GradientStep(transforms.identity(), o2, m2.trainable_variables)
    xa, ya, xb, yb = X[:8], Y[:8], X[8:], Y[8:]
    ga, gb = _grads(m1, xa, ya), _grads(m1, xb, yb)
    w0 = [v.numpy().copy() for v in m1.trainable_variables]
    assert not bool(s1(ga)["applied"])
    for a, v in zip(w0, m1.trainable_variables):
        np.testing.assert_array_equal(a, v.numpy())
    assert bool(s1(gb)["applied"])
    s2([(a + b) / 2 for a, b in zip(ga, gb)])
    for a, b in zip(m1.trainable_variables, m2.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    assert int(o1.iterations) == 1
    # with equal halves, mean gradient == full-batch gradient
    np.testing.assert_allclose(
        [np.sum(g) for g in _grads(m1, X, Y)],
        [np.sum((a + b) / 2) for a, b in zip(_grads(m1, xa, ya), _grads(m1, xb, yb))],
        rtol=1e-4, atol=1e-6)


def test_gradient_step_masked_freezes_layer():
    model = _mlp()
    vs = model.trainable_variables
    first = vs[0].path
    step = transforms.GradientStep(transforms.masked(transforms.identity(), lambda n: n != first),
                                   keras.optimizers.Adam(1e-2), vs)
    before = [v.numpy().copy() for v in vs]
    step(_grads(model, X, Y))
    np.testing.assert_array_equal(before[0], vs[0].numpy())
    assert not np.array_equal(before[2], vs[2].numpy())


@pytest.mark.parametrize("jit", [False, True])
def test_gradient_step_in_tf_function_traces_once(jit):
    model = _mlp()
    guarded = transforms.chain(transforms.clip_by_global_norm(1.0), transforms.add_noise(0.01, seed=1))
    transform = transforms.chain(transforms.apply_if_finite(guarded, 3), transforms.accumulate(2))
    step = transforms.GradientStep(transform, keras.optimizers.Adam(1e-2), model.trainable_variables)
    traces = []

    @tf.function(jit_compile=jit)
    def train(x, y):
        traces.append(1)
        return step(_grads(model, x, y))

    applied = []
    for _ in range(4):
        stats = train(X, Y)
        applied.append(bool(stats["applied"]))
    assert applied == [False, True, False, True]
    assert len(traces) == 1
    assert int(step.optimizer.iterations) == 2
    for v in model.trainable_variables:
        assert np.all(np.isfinite(v.numpy()))


def test_gradient_step_checkpoint_roundtrip(tmp_path):
    model = _mlp()
    step = transforms.GradientStep(transforms.accumulate(3), keras.optimizers.SGD(0.1),
                                   model.trainable_variables)
    step(_grads(model, X, Y))
    ckpt = tf.train.Checkpoint(step=step)
    path = ckpt.save(str(tmp_path / "ck"))
    saved = _np(step.state)
    step(_grads(model, X, Y))
    assert int(step.state.mini_step) == 2
    ckpt.restore(path)
    assert int(step.state.mini_step) == 1
    for a, b in zip(saved, _np(step.state)):
        np.testing.assert_array_equal(a, b)


def test_gradient_step_counts_nonfinite_without_apply_if_finite():
    model = _mlp()
    tv = [v.value for v in model.trainable_variables]  # plain tf.Variables are accepted too
    step = transforms.GradientStep(transforms.zero_nonfinite(), keras.optimizers.SGD(0.1), tv)
    bad = [g * np.nan for g in _grads(model, X, Y)]
    stats = step(bad)
    assert bool(stats["applied"]) and int(stats["nonfinite_steps"]) == 1
    assert all(np.all(np.isfinite(v.numpy())) for v in tv)


def test_gradient_step_bad_input():
    model = _mlp()
    vs = model.trainable_variables
    step = transforms.GradientStep(transforms.identity(), keras.optimizers.SGD(0.1), vs)
    grads = list(_grads(model, X, Y))
    grads[1] = None
    with pytest.raises(ValueError, match=vs[1].path):
        step(grads)
    with pytest.raises(ValueError, match="grads"):
        step(grads[:2])
    with pytest.raises(TypeError, match="transform"):
        transforms.GradientStep(lambda g: g, keras.optimizers.SGD(0.1), vs)
    with pytest.raises(ValueError, match="variables"):
        transforms.GradientStep(transforms.identity(), keras.optimizers.SGD(0.1), [])


# ---------------------------------------------------------------- the package and its vocabulary


@pytest.mark.parametrize("name", ["_base", "_clipping", "_nonfinite", "_accumulate", "_noise",
                                  "_masking", "_step"])
def test_every_module_docstring_example_runs(name):
    import importlib

    module = importlib.import_module(f"robustgrad.transforms.{name}")
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_public_names_are_one_object_whichever_path():
    import robustgrad
    from robustgrad.errors import NonFiniteError, NonFiniteGradientError
    from robustgrad.transforms._step import GradientStep

    assert transforms.GradientStep is GradientStep is robustgrad.GradientStep
    assert transforms.NonFiniteGradientError is NonFiniteGradientError is robustgrad.NonFiniteGradientError
    assert robustgrad.NonFiniteError is NonFiniteError
    assert issubclass(NonFiniteGradientError, NonFiniteError)
    assert issubclass(NonFiniteError, ValueError)
    assert all(hasattr(transforms, n) for n in transforms.__all__)


def test_apply_if_finite_state_uses_the_nonfinite_vocabulary():
    assert transforms.ApplyIfFiniteState._fields == (
        "nonfinite_count", "last_finite", "total_nonfinite", "max_nonfinite_steps", "inner_state")
    t = transforms.apply_if_finite(transforms.identity(), max_nonfinite_steps=4)
    s = t.init([tf.zeros(1)])
    _, s = t.update([tf.constant([np.nan])], s)
    _, s = t.update([tf.constant([np.inf])], s)
    assert (int(s.nonfinite_count), int(s.total_nonfinite), int(s.max_nonfinite_steps)) == (2, 2, 4)
    assert [int(x) for x in transforms.nonfinite_count(s)] == [2, 4]
    for old, new in (("notfinite_count", "nonfinite_count"), ("total_notfinite", "total_nonfinite"),
                     ("max_consecutive_errors", "max_nonfinite_steps")):
        with pytest.warns(DeprecationWarning, match=new):
            assert int(getattr(s, old)) == int(getattr(s, new))


def test_max_consecutive_errors_is_a_deprecated_keyword():
    with pytest.warns(DeprecationWarning, match="max_nonfinite_steps"):
        t = transforms.apply_if_finite(transforms.identity(), max_consecutive_errors=3)
    assert int(t.init([tf.zeros(1)]).max_nonfinite_steps) == 3
    with pytest.raises(TypeError, match="max_nonfinite_steps only"):
        transforms.apply_if_finite(transforms.identity(), 2, max_consecutive_errors=3)
    with pytest.raises(ValueError, match="max_nonfinite_steps .* must be an int >= 0, got -2"):
        transforms.apply_if_finite(transforms.identity(), max_nonfinite_steps=-2)
    with pytest.raises(TypeError, match="max_nonfinite_steps"):
        transforms.apply_if_finite(transforms.identity(), max_nonfinite_steps=1.5)


def test_raise_if_exceeded_names_the_limit_and_is_a_nonfinite_error():
    import robustgrad

    model = _mlp()
    step = transforms.GradientStep(transforms.apply_if_finite(transforms.identity(), max_nonfinite_steps=1),
                                   keras.optimizers.SGD(0.1), model.trainable_variables)
    bad = [g * np.nan for g in _grads(model, X, Y)]
    stats = step(bad)
    step.raise_if_exceeded(stats)          # 1 <= limit 1: no error
    step.raise_if_exceeded()
    stats = step(bad)
    with pytest.raises(robustgrad.NonFiniteError, match=r"2 consecutive .*max_nonfinite_steps \(1\)"):
        step.raise_if_exceeded(stats)
    with pytest.raises(transforms.NonFiniteGradientError, match="2 consecutive"):
        step.raise_if_exceeded()


def test_validation_messages_name_argument_value_and_range():
    with pytest.raises(ValueError, match=r"max_norm must be a number >= 0, got -1.0"):
        transforms.clip_by_global_norm(-1.0)
    with pytest.raises(ValueError, match=r"clipping must be a number > 0, got 0"):
        transforms.adaptive_clip(0)
    with pytest.raises(ValueError, match=r"min_value must be a number <= 1, got 2.0"):
        transforms.clip_by_value(1.0, min_value=2.0)
    with pytest.raises(TypeError, match=r"k must be an int >= 1, got 1.5"):
        transforms.accumulate(1.5)
    with pytest.raises(ValueError, match=r"stddev must be a number >= 0, got nan"):
        transforms.add_noise(float("nan"))
    u, _ = _run(transforms.clip_by_norm(float("inf")), [tf.constant([3.0, 4.0])])
    np.testing.assert_allclose(u[0], [3.0, 4.0])       # an infinite bound clips nothing
