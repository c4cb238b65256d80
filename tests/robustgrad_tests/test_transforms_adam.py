"""Tests for robustgrad.transforms' Adam: scale_by_adam, scale_by_learning_rate, adam, and
GradientStep with a transformation as its optimizer (pure and fused paths)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from robustgrad import transforms as T  # noqa: N812


def _np_adam(grads, lr, b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, style="pytorch", w0=None):
    """Hand-written Adam (Kingma & Ba 2015) in float64: the weights after each gradient."""
    w = np.zeros_like(grads[0], np.float64) if w0 is None else np.array(w0, np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    out = []
    for t, g in enumerate(grads, start=1):
        g = np.asarray(g, np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        if style == "pytorch":
            w = w - lr * m_hat / (np.sqrt(v_hat + eps_root) + eps)
        else:  # eps on sqrt(v) before the bias correction (Keras, TF's ApplyAdam)
            w = w - lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (np.sqrt(v) + eps)
        out.append(w.copy())
    return out


def _grads(steps=6, shape=(3, 4), seed=0):
    rng = np.random.default_rng(seed)
    scales = np.array([1e-6, 1e-4, 1e-2, 1.0])  # small gradients show where epsilon goes
    return [(rng.normal(size=shape) * scales).astype(np.float32) for _ in range(steps)]


@pytest.mark.parametrize("style,eps,eps_root", [("pytorch", 1e-5, 0.0), ("keras", 1e-5, 0.0),
                                                ("pytorch", 1e-8, 1e-10)])
def test_adam_matches_hand_written_numpy(style, eps, eps_root):
    grads = _grads()
    t = T.adam(1e-2, eps=eps, eps_root=eps_root, eps_style=style)
    w = np.zeros((3, 4), np.float32)
    state = t.init([tf.constant(w)])
    ours = []
    for g in grads:
        u, state = t.update([tf.constant(g)], state)
        w = w + u[0].numpy()
        ours.append(w.copy())
    ref = _np_adam(grads, 1e-2, eps=eps, eps_root=eps_root, style=style)
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-9)
    assert int(state[0].count) == len(grads)
    # the two conventions differ where |g| is near eps (columns 0-1), as documented
    other = _np_adam(grads, 1e-2, eps=eps, style="keras" if style == "pytorch" else "pytorch")
    if eps_root == 0.0:
        assert np.max(np.abs(other[0][:, 0] - ref[0][:, 0])) > 1e-4


def test_keras_style_matches_keras_adam():
    grads = _grads(5)
    var_k = keras.Variable(np.zeros((3, 4), np.float32))
    opt = keras.optimizers.Adam(learning_rate=1e-2, beta_1=0.9, beta_2=0.999, epsilon=1e-5)
    t = T.adam(1e-2, eps=1e-5, eps_style="keras")
    w = tf.Variable(tf.zeros((3, 4)))
    state = t.init([w])
    for g in grads:
        opt.apply_gradients([(tf.constant(g), var_k)])
        u, state = t.update([tf.constant(g)], state)
        w.assign_add(u[0])
        np.testing.assert_allclose(w.numpy(), var_k.numpy(), rtol=1e-5, atol=1e-9)
    # and PyTorch's convention is not Keras' (small gradients move more, by design)
    torch_like = _np_adam(grads, 1e-2, eps=1e-5)[-1]
    assert np.abs(torch_like[:, 0]).mean() > 3 * np.abs(var_k.numpy()[:, 0]).mean()


def test_state_structure_dtypes_and_per_leaf_shapes():
    params = {"w": tf.zeros((2, 3)), "b": tf.zeros((3,), tf.float64),
              "h": tf.zeros((1,), tf.float16)}
    t = T.scale_by_adam()
    state = t.init(params)
    assert isinstance(state, T.ScaleByAdamState)
    assert state.count.dtype == tf.int64 and int(state.count) == 0
    assert set(state.mu) == set(state.nu) == {"w", "b", "h"}
    grads = {"w": tf.ones((2, 3)), "b": tf.fill((3,), tf.constant(-2.0, tf.float64)),
             "h": tf.ones((1,), tf.float16)}
    u, state = t.update(grads, state)
    for k in params:
        assert u[k].dtype == params[k].dtype == state.mu[k].dtype == state.nu[k].dtype
        assert u[k].shape == params[k].shape
    np.testing.assert_allclose(u["b"], [-1.0] * 3, rtol=1e-6)  # first step: sign(g)
    np.testing.assert_allclose(state.nu["b"], [0.004] * 3, rtol=1e-12)  # (1 - b2) * g^2 in f64


def test_learning_rate_constant_variable_schedule_and_sign():
    g = [tf.constant([2.0])]
    u, s = T.scale_by_learning_rate(0.5).update(g, T.EmptyState())
    assert float(u[0][0]) == -1.0 and s == T.EmptyState()
    u, _ = T.scale_by_learning_rate(0.5, flip_sign=False).update(g, T.EmptyState())
    assert float(u[0][0]) == 1.0
    lr = tf.Variable(0.25)
    t = T.scale_by_learning_rate(lr)
    u, _ = t.update(g, t.init(g))
    lr.assign(0.125)
    u2, _ = t.update(g, t.init(g))
    assert (float(u[0][0]), float(u2[0][0])) == (-0.5, -0.25)
    seen = []
    t = T.scale_by_learning_rate(lambda c: seen.append(int(c)) or 0.1 * tf.cast(c + 1, tf.float32))
    s = t.init(g)
    for _ in range(3):
        u, s = t.update(g, s)
    assert seen == [0, 1, 2] and int(s.count) == 3
    np.testing.assert_allclose(float(u[0][0]), -0.6, rtol=1e-6)


@pytest.mark.parametrize("bad,match", [
    (lambda: T.scale_by_adam(b1=1.0), "b1"), (lambda: T.scale_by_adam(b2=-0.1), "b2"),
    (lambda: T.scale_by_adam(eps=-1.0), "eps"), (lambda: T.scale_by_adam(eps_root=float("nan")), "eps_root"),
    (lambda: T.scale_by_adam(eps_style="torch"), "eps_style"),
    (lambda: T.scale_by_learning_rate(-1e-3), "learning_rate"),
    (lambda: T.scale_by_learning_rate("fast"), "learning_rate"),
    (lambda: T.scale_by_learning_rate(tf.Variable([1.0, 2.0])), "learning_rate"),
    (lambda: T.scale_by_learning_rate(tf.Variable(1)), "learning_rate"),
    (lambda: T.adam(1e-3, eps_style="pytroch"), "eps_style"),
])
def test_bad_arguments_are_named(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        bad()


def test_state_and_updates_checked():
    t = T.scale_by_adam()
    with pytest.raises(TypeError, match="ScaleByAdamState"):
        t.update([tf.ones(2)], T.EmptyState())
    with pytest.raises(ValueError, match="structure"):
        t.update([tf.ones(2), tf.ones(1)], t.init([tf.zeros(2)]))
    with pytest.raises(TypeError, match="dtype"):
        t.init([tf.zeros(2, tf.int32)])


def test_rejected_step_never_moves_the_moments():
    """apply_if_finite around Adam: a non-finite step leaves count, mu and nu exactly as they
    were and its update is zero; the next finite step continues as if it never happened."""
    t = T.apply_if_finite(T.adam(0.1), 5)
    g = [tf.constant([1.0, -2.0])]
    _, s = t.update(g, t.init(g))
    before = [x.numpy().copy() for x in tf.nest.flatten(s.inner_state)]
    u, s2 = t.update([tf.constant([np.nan, 1.0])], s)
    assert not bool(s2.last_finite) and u[0].numpy().tolist() == [0.0, 0.0]
    for a, b in zip(before, tf.nest.flatten(s2.inner_state)):
        np.testing.assert_array_equal(a, b.numpy())
    u_after, _ = t.update(g, s2)
    u_direct, _ = t.update(g, s)
    np.testing.assert_array_equal(u_after[0].numpy(), u_direct[0].numpy())


def _pure_adam(lr, **kw):
    """adam(lr) that GradientStep cannot fuse (a third, neutral part): the pure path."""
    return T.chain(T.scale_by_adam(**kw), T.scale_by_learning_rate(lr), T.identity())


def _run_step(optimizer, grads, transform=None, compile_=True, jit=False):
    vs = [tf.Variable(tf.zeros(g.shape, g.dtype)) for g in grads[0]]
    step = T.GradientStep(transform or T.chain(T.apply_if_finite(T.clip_by_global_norm(1.0), 5)),
                          optimizer, vs)
    fn = tf.function(step.step, jit_compile=jit) if compile_ else step.step
    stats = [fn([tf.constant(g) for g in gs]) for gs in grads]
    return step, vs, stats


@pytest.mark.parametrize("style", ["pytorch", "keras"])
def test_gradient_step_fused_equals_pure_equals_numpy(style):
    grads = [[g, g[0] * 3.0] for g in _grads(5)]
    lr = tf.Variable(0.01)
    fused, vf, _ = _run_step(T.adam(lr, eps=1e-5, eps_style=style), grads,
                             transform=T.chain(T.identity()))
    pure, vp, _ = _run_step(_pure_adam(lr, eps=1e-5, eps_style=style), grads,
                            transform=T.chain(T.identity()))
    assert fused._fused is not None and pure._fused is None
    ref = _np_adam([g[0] for g in grads], 0.01, eps=1e-5, style=style)[-1]
    np.testing.assert_allclose(vf[0].numpy(), ref, rtol=2e-5, atol=1e-9)
    # the kernel forms 1 - b2 in float32 (0.00099998713): ~1e-5 relative, as documented
    for a, b in zip(vf, vp):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=3e-5, atol=1e-9)
    for a, b in zip(tf.nest.flatten(fused.optimizer_state), tf.nest.flatten(pure.optimizer_state)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=3e-5, atol=1e-12)
    assert int(fused.optimizer_state[0].count) == 5


def test_fused_path_is_one_kernel_per_variable():
    vs = [tf.Variable(tf.zeros((4, 3))), tf.Variable(tf.zeros(3))]
    step = T.GradientStep(T.chain(T.apply_if_finite(T.identity(), 5)), T.adam(1e-3), vs)
    graph = tf.function(step.step).get_concrete_function(
        [tf.TensorSpec((4, 3)), tf.TensorSpec((3,))]).graph
    gd = graph.as_graph_def()  # the kernel sits in the tf.cond branch (a library function)
    nodes = list(gd.node) + [n for f in gd.library.function for n in f.node_def]
    assert sum(n.op == "ResourceApplyAdam" for n in nodes) == 2


def test_gradient_step_rejected_step_leaves_optimizer_state_and_weights():
    for opt in (T.adam(0.1), _pure_adam(0.1)):
        step, vs, _ = _run_step(opt, [[np.ones((2,), np.float32)]])
        before = [x.numpy().copy() for x in tf.nest.flatten(step.optimizer_state)] + [vs[0].numpy()]
        stats = step.step([tf.constant([np.nan, 1.0])])
        assert not bool(stats["applied"])
        after = [x.numpy() for x in tf.nest.flatten(step.optimizer_state)] + [vs[0].numpy()]
        for a, b in zip(before, after):
            np.testing.assert_array_equal(a, b)


def test_schedule_fused_and_pure_agree_and_count():
    sched = lambda c: 0.1 / tf.cast(c + 1, tf.float32)  # noqa: E731
    grads = [[g] for g in _grads(4)]
    fused, vf, _ = _run_step(T.adam(sched), grads, transform=T.chain(T.identity()))
    pure, vp, _ = _run_step(_pure_adam(sched), grads, transform=T.chain(T.identity()))
    assert fused._fused is not None
    np.testing.assert_allclose(vf[0].numpy(), vp[0].numpy(), rtol=3e-5, atol=1e-9)
    assert int(fused.optimizer_state[1].count) == int(pure.optimizer_state[1].count) == 4


def test_trace_once_with_annealed_learning_rate():
    lr = tf.Variable(0.1)
    traces = []
    v = tf.Variable([1.0, 2.0])
    step = T.GradientStep(T.chain(T.apply_if_finite(T.clip_by_global_norm(1.0), 5)), T.adam(lr), [v])

    @tf.function
    def train(g):
        traces.append(1)
        return step.step([g])

    for i in range(4):
        lr.assign(0.1 / (i + 1))
        train(tf.constant([0.5, -0.5]))
    assert len(traces) == 1 and int(step.optimizer_state[0].count) == 4


@pytest.mark.parametrize("opt", ["fused", "pure"])
def test_xla_compiles_on_cpu_and_matches_graph(opt):
    make = (lambda: T.adam(0.01, eps=1e-5)) if opt == "fused" else (lambda: _pure_adam(0.01, eps=1e-5))
    grads = [[g] for g in _grads(3)]
    _, v_xla, _ = _run_step(make(), grads, jit=True)
    _, v_graph, _ = _run_step(make(), grads)
    np.testing.assert_allclose(v_xla[0].numpy(), v_graph[0].numpy(), rtol=1e-5, atol=1e-9)


def test_optimizer_none_adds_the_transform_updates():
    """optimizer=None: the transform is the whole optimizer (Adam inside the guard)."""
    grads = [[g] for g in _grads(3)]
    step, v, _ = _run_step(None, grads, transform=T.apply_if_finite(T.adam(0.01, eps=1e-5), 5))
    ref = _np_adam([g[0] for g in grads], 0.01, eps=1e-5)[-1]
    np.testing.assert_allclose(v[0].numpy(), ref, rtol=2e-5, atol=1e-9)
    with pytest.raises(TypeError, match="optimizer"):
        T.GradientStep(T.identity(), "adam", [tf.Variable([1.0])])


def test_checkpoint_round_trip_of_optimizer_state(tmp_path):
    v = tf.Variable([1.0, 2.0])
    step = T.GradientStep(T.chain(T.identity()), T.adam(0.1), [v])
    step.step([tf.constant([1.0, 1.0])])
    path = tf.train.Checkpoint(step=step, v=v).write(str(tmp_path / "ck"))
    v2 = tf.Variable([0.0, 0.0])
    step2 = T.GradientStep(T.chain(T.identity()), T.adam(0.1), [v2])
    tf.train.Checkpoint(step=step2, v=v2).read(path).assert_consumed()
    assert int(step2.optimizer_state[0].count) == 1
    np.testing.assert_array_equal(step2.optimizer_state[0].mu[0].numpy(),
                                  step.optimizer_state[0].mu[0].numpy())


def test_scale_by_adam_inits_on_a_traced_batch_of_unknown_size():
    # an attack's optimiser starts inside tf.function on inputs whose batch is unknown
    t = T.scale_by_adam()

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def first_step(g):
        state = t.init(g)
        u, state = t.update(g, state)
        return u, state.mu

    u, mu = first_step(tf.constant([[2.0, -0.5, 0.0], [1.0, 1.0, -3.0]]))
    np.testing.assert_allclose(u.numpy(), [[1.0, -1.0, 0.0], [1.0, 1.0, -1.0]], atol=1e-5)
    np.testing.assert_allclose(mu.numpy(), [[0.2, -0.05, 0.0], [0.1, 0.1, -0.3]], rtol=1e-6)
