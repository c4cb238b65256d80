"""The seed-axis transformations: seed_axis_adam and SeedAxisStep against the plain composition
(per_seed of the one-seed chain) and against S separate one-seed GradientSteps."""

import numpy as np
import pytest
import tensorflow as tf

from robustgrad import transforms as T  # noqa: N812 - optax-style short name

NAN = np.nan
INIT = [np.array([[1.0, -2.0, 0.5], [0.3, 0.2, -0.1], [0.0, 1.0, 2.0]], np.float32),
        np.array([[0.5], [-0.5], [0.25]], np.float32)]
# step 2 rejects seed 1 (non-finite), step 3 switches seed 2 off (active); steps 4-5 run with
# unequal counts; seed 0's first gradient is clipped (norm 5 > 1), the others' are not
GRADS = [([[3.0, 4.0, 0.0], [0.1, -0.2, 0.3], [0.0, 0.1, 0.0]], [[0.0], [0.2], [-0.1]]),
         ([[0.5, 0.5, -1.0], [NAN, 0.0, 0.0], [0.2, 0.2, 0.2]], [[1.0], [0.0], [0.3]]),
         ([[-1.0, 2.0, 0.2], [2.0, 2.0, -9.0], [5.0, 5.0, 5.0]], [[0.1], [0.1], [0.1]]),
         ([[0.3, 0.0, 0.1], [0.0, 0.4, 0.0], [-0.2, 0.1, 0.0]], [[0.0], [1.0], [-1.0]]),
         ([[1e-3, 0.0, 0.0], [0.0, -1e-3, 0.0], [0.0, 0.0, 7.0]], [[0.5], [0.5], [0.5]])]
ACTIVE = [None, None, [True, True, False], None, [True, False, True]]


def _grads(i):
    return [tf.constant(np.array(g, np.float32)) for g in GRADS[i]]


def _active(i):
    return None if ACTIVE[i] is None else tf.constant(ACTIVE[i])


def _alone():
    """What each seed does alone: a one-seed GradientStep (guard, clip 1.0, Adam lr 0.1)."""
    out = []
    for s in range(3):
        vs = [tf.Variable(x[s]) for x in INIT]
        step = T.GradientStep(T.apply_if_finite(T.clip_by_global_norm(1.0), 10**9),
                              T.adam(0.1, eps=1e-5), vs)
        out.append((vs, step))
    return out


def _step_alone(alone, i):
    for s, (_vs, step) in enumerate(alone):
        if ACTIVE[i] is None or ACTIVE[i][s]:
            step.step([g[s] for g in _grads(i)])


def _stack(alone):
    return [np.stack([vs[k].numpy() for vs, _ in alone]) for k in range(len(INIT))]


@pytest.mark.parametrize("stacked", [True, False], ids=["seed_axis_adam", "per_seed"])
def test_seed_axis_transformations_equal_separate_adams(stacked):
    if stacked:
        t = T.seed_axis_adam(0.1, max_grad_norm=1.0)
    else:  # the plain composition: the one-seed chain on each seed's slice
        t = T.per_seed(T.chain(T.clip_by_global_norm(1.0), T.adam(0.1, eps=1e-5)))
    params = [tf.constant(x) for x in INIT]
    state = t.init(params)
    alone = _alone()
    for i in range(len(GRADS)):
        updates, state = t.update(_grads(i), state, params, active=_active(i))
        params = [p + u for p, u in zip(params, updates)]
        _step_alone(alone, i)
        for got, want in zip(params, _stack(alone)):
            # the one-seed steps run the fused kernel, which forms 1 - b2 in float32 (about 2e-6
            # here); a wrong bias correction, clip scale or a moment that moved on a skipped
            # step is off by 1e-3 or more
            np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-5)
    count = state.count if stacked else state[1][0].count
    assert count.numpy().tolist() == [5, 3, 4]


def test_the_stacked_update_equals_the_plain_composition_leaf_by_leaf():
    stacked = T.seed_axis_adam(0.05, max_grad_norm=0.7, b1=0.8, b2=0.99, eps=1e-3)
    plain = T.per_seed(T.chain(T.clip_by_global_norm(0.7),
                               T.adam(0.05, b1=0.8, b2=0.99, eps=1e-3)))
    params = [tf.constant(x) for x in INIT]
    s1, s2 = stacked.init(params), plain.init(params)
    for i in range(len(GRADS)):
        u1, s1 = stacked.update(_grads(i), s1, active=_active(i))
        u2, s2 = plain.update(_grads(i), s2, active=_active(i))
        for a, b in zip(u1 + s1.mu + s1.nu, u2 + list(s2[1][0].mu) + list(s2[1][0].nu)):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-8)
        np.testing.assert_array_equal(s1.count.numpy(), s2[1][0].count.numpy())


@pytest.mark.parametrize("fused", [True, False])
def test_seed_axis_step_equals_separate_adams(fused):
    # steps 1 (and 2 for the others) take the fused path when fused=True: every seed steps with
    # equal counts; after the rejection the stacked path runs
    vs = [tf.Variable(x) for x in INIT]
    step = T.SeedAxisStep(vs, 0.1, max_grad_norm=1.0, fused=fused)
    alone = _alone()
    for i in range(len(GRADS)):
        out = step.step(_grads(i), _active(i))
        _step_alone(alone, i)
        applied = [bool(np.isfinite(GRADS[i][0][s]).all()) and
                   (ACTIVE[i] is None or ACTIVE[i][s]) for s in range(3)]
        assert out["applied"].numpy().tolist() == applied
        for got, want in zip(vs, _stack(alone)):
            # the fused kernel forms 1 - b2 in float32 (module doc): a few 1e-6 on these steps
            np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-5)
    assert step.iterations.numpy().tolist() == [5, 3, 4]


def test_fused_and_stacked_paths_agree_in_a_compiled_step():
    grads = [tf.constant(np.array(g, np.float32)) for g in GRADS[0]]
    results = []
    for fused in (True, False):
        vs = [tf.Variable(x) for x in INIT]
        step = T.SeedAxisStep(vs, 0.1, max_grad_norm=1.0, fused=fused)
        run = tf.function(step.step)
        for _ in range(3):
            run(grads)
        step.learning_rate.assign(0.01)  # read at every step, no retrace
        run(grads)
        assert run.experimental_get_tracing_count() == 1
        results.append([v.numpy() for v in vs])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)  # the kernel's 1 - b2 (above)


def test_seed_global_norm_is_per_seed():
    norm = T.seed_global_norm([tf.constant([[3.0, 0.0], [0.0, 0.0]]),
                               tf.constant([[[4.0]], [[NAN]]])])
    assert norm.numpy()[0] == 5.0 and np.isnan(norm.numpy()[1])


def test_refusals_name_the_argument():
    with pytest.raises(ValueError, match="leading seed axis"):
        T.seed_axis_adam(0.1).init([tf.constant(1.0)])
    with pytest.raises(ValueError, match="disagree on the seed axis: sizes \\[2, 3\\]"):
        T.per_seed(T.adam()).init([tf.zeros([2, 1]), tf.zeros([3, 1])])
    with pytest.raises(ValueError, match="learning_rate"):
        T.seed_axis_adam(-1.0)
    with pytest.raises(ValueError, match="learning_rate: a variable learning rate"):
        T.seed_axis_adam(tf.Variable([0.1]))
    with pytest.raises(ValueError, match="b1"):
        T.seed_axis_adam(0.1, b1=1.0)
    with pytest.raises(ValueError, match="max_grad_norm"):
        T.seed_axis_adam(0.1, max_grad_norm=-1.0)
    with pytest.raises(TypeError, match="fused must be a bool"):
        T.SeedAxisStep([tf.Variable(tf.zeros([2, 1]))], 0.1, fused=1)
    with pytest.raises(ValueError, match="expected 1 gradients"):
        T.SeedAxisStep([tf.Variable(tf.zeros([2, 1]))], 0.1).step([tf.zeros([2, 1])] * 2)
    with pytest.raises(TypeError, match="state: expected the ScaleByAdamState"):
        T.seed_axis_adam(0.1).update([tf.zeros([2, 1])], ())
