"""GradientStep's fused Adam without a conditional (``_masked_adam``, graph mode): a rejected
step runs the kernel as a no-op instead of skipping it in a ``tf.cond``. It must give the very
same bits as the conditional path: weights, moments, counts, the guard's state and every returned
statistic, on accepted and rejected steps (NaN, Inf, a rejected first step). Under XLA the
conditional path stays (fused there, XLA's CPU code rounds a last bit differently)."""

import numpy as np
import pytest
import tensorflow as tf

from robustgrad import transforms as T  # noqa: N812

SHAPES = [(4, 8), (8,), (8, 2)]


def _grads(steps=7, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        gs = [(rng.normal(size=s) * 10.0 ** rng.integers(-6, 1)).astype(np.float32)
              for s in SHAPES]
        if t in (0, 3):  # a rejected first step (count 0) and a rejected step later
            gs[1][2] = np.nan
        if t == 4:
            gs[2][0, 1] = np.inf
        out.append(gs)
    return out


def _run(masked, jit, optimizer, dtype=tf.float32, transform=None, zeroes=True):
    rng = np.random.default_rng(1)
    vs = [tf.Variable(tf.constant(rng.normal(size=s), dtype)) for s in SHAPES]
    step = T.GradientStep(transform or T.chain(T.apply_if_finite(T.clip_by_global_norm(0.5), 9)),
                          optimizer(), vs)
    assert step._masked_adam and step._zeroes_rejected == zeroes
    step._masked_adam = masked  # False: the general tf.cond path, the reference
    fn = tf.function(step.step, jit_compile=jit)
    stats = [fn([tf.constant(g, dtype) for g in gs]) for gs in _grads()]
    state = [x.numpy() for x in tf.nest.flatten((step.state, step.optimizer_state))]
    counts = (int(step.optimizer_state[0].count), int(step.state[0].total_nonfinite))
    return ([v.numpy() for v in vs], state, [{k: x.numpy() for k, x in s.items()} for s in stats],
            counts)


def _same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes(), (a, b)


@pytest.mark.parametrize("optimizer", [
    lambda: T.adam(tf.Variable(0.05), eps=1e-5),
    lambda: T.adam(lambda c: 0.1 / tf.cast(c + 1, tf.float32), eps=1e-3, eps_style="keras"),
], ids=["pytorch-variable-lr", "keras-schedule"])
def test_masked_fused_adam_is_bit_identical_to_the_conditional(optimizer):
    fast = _run(True, False, optimizer)
    ref = _run(False, False, optimizer)
    for a, b in zip(fast[0] + fast[1], ref[0] + ref[1]):
        _same_bits(a, b)
    applied = [bool(s["applied"]) for s in fast[2]]
    assert applied == [False, True, True, False, False, True, True]
    for s, r in zip(fast[2], ref[2]):
        assert s.keys() == r.keys()
        for k in s:
            _same_bits(np.asarray(s[k]), np.asarray(r[k]))
    # Adam's count moved only on the 4 accepted steps; the guard counted the 3 rejected ones
    assert fast[3] == ref[3] == (4, 3)
    assert [int(s["nonfinite_steps"]) for s in fast[2]] == [1, 0, 0, 1, 2, 0, 0]


def test_masked_path_float64_variables_bit_identical():
    opt = lambda: T.adam(0.01, eps=1e-5)  # noqa: E731
    fast, ref = _run(True, False, opt, tf.float64), _run(False, False, opt, tf.float64)
    for a, b in zip(fast[0] + fast[1], ref[0] + ref[1]):
        _same_bits(a, b)


def test_masked_path_has_no_conditional_and_eps_zero_keeps_it():
    vs = [tf.Variable(tf.zeros((4, 3))), tf.Variable(tf.zeros(3))]
    specs = [tf.TensorSpec((4, 3)), tf.TensorSpec((3,))]
    guard = T.chain(T.apply_if_finite(T.clip_by_global_norm(1.0), 5))

    def ops(step):
        gd = tf.function(step.step).get_concrete_function(specs).graph.as_graph_def()
        return [n.op for n in list(gd.node) + [n for f in gd.library.function for n in f.node_def]]

    fast = ops(T.GradientStep(guard, T.adam(1e-3, eps=1e-5), vs))
    assert fast.count("ResourceApplyAdam") == 2
    assert not {"If", "StatelessIf"} & set(fast)
    # eps = 0: m / sqrt(v) may be 0/0 on a no-op step, so the conditional stays
    step0 = T.GradientStep(guard, T.adam(1e-3, eps=0.0), vs)
    assert not step0._masked_adam
    assert {"If", "StatelessIf"} & set(ops(step0))


def test_masked_path_leaves_everything_on_a_rejected_step_eagerly():
    v = tf.Variable([1.0, -2.0, 3.0])
    step = T.GradientStep(T.chain(T.apply_if_finite(T.identity(), 5)), T.adam(0.1, eps=1e-5), [v])
    step.step([tf.constant([1.0, -1.0, 0.5])])
    before = [v.numpy().copy()] + [x.numpy().copy() for x in tf.nest.flatten(step.optimizer_state)]
    stats = step.step([tf.constant([np.nan, 1.0, 1.0])])
    after = [v.numpy()] + [x.numpy() for x in tf.nest.flatten(step.optimizer_state)]
    assert not bool(stats["applied"]) and int(step.optimizer_state[0].count) == 1
    for a, b in zip(before, after):
        _same_bits(a, b)


def _normalize_by_max():
    """Each leaf divided by its largest magnitude: zeros (a rejected step's) become NaN."""
    def update(updates, state, params=None):
        return [u / tf.reduce_max(tf.abs(u)) for u in updates], state

    return T.GradientTransformation(lambda params: (), update)


def test_without_apply_if_finite_last_the_updates_are_gated_and_still_bit_identical():
    # the guard first, then a transformation that turns the guard's zeros into NaN: the fused
    # kernel must still get zeros on a rejected step
    def transform():
        return T.chain(T.apply_if_finite(T.identity(), 9), _normalize_by_max())

    opt = lambda: T.adam(0.02, eps=1e-5)  # noqa: E731
    fast = _run(True, False, opt, transform=transform(), zeroes=False)
    ref = _run(False, False, opt, transform=transform(), zeroes=False)
    for a, b in zip(fast[0] + fast[1], ref[0] + ref[1]):
        _same_bits(a, b)
    assert all(np.isfinite(w).all() for w in fast[0])
    assert fast[3] == ref[3] == (4, 3)


def test_xla_keeps_the_conditional_path():
    from robustgrad.transforms._step import _in_xla

    seen = []
    tf.function(lambda: seen.append(_in_xla()) or tf.constant(0), jit_compile=True)()
    tf.function(lambda: seen.append(_in_xla()) or tf.constant(0))()
    assert seen == [True, False]
    opt = lambda: T.adam(0.05, eps=1e-5)  # noqa: E731
    fast, ref = _run(True, True, opt), _run(False, True, opt)
    for a, b in zip(fast[0] + fast[1], ref[0] + ref[1]):
        _same_bits(a, b)
