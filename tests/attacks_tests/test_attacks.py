"""Attacks: invariants, known answers on fixed models, tracing, and argument validation."""

import numpy as np
import pytest
import tensorflow as tf

import attacks
from attacks import norms

from small_models import Linear, SmallNet, small_batch

NORMS = ("linf", "l2", "l1")


ATTACK_FNS = {
    "fgm": lambda m, x, y, **kw: attacks.fast_gradient_method(m, x, y, **kw),
    "pgd": lambda m, x, y, **kw: attacks.projected_gradient_descent(m, x, y, steps=5, **kw),
    "bim": lambda m, x, y, **kw: attacks.basic_iterative_method(m, x, y, steps=5, **kw),
    "mim": lambda m, x, y, **kw: attacks.momentum_iterative_method(m, x, y, steps=5, **kw),
}


# ----------------------------------------------------------------------------- norms


@pytest.mark.parametrize("norm", NORMS)
def test_projection_is_exact_and_idempotent(norm):
    rng = np.random.default_rng(0)
    d = tf.constant(rng.normal(0, 1, (8, 3, 5)).astype(np.float64))
    eps = 0.7
    p = norms.project(d, eps, norm)
    assert np.all(norms.norm(p, norm).numpy() <= eps + 1e-9)
    np.testing.assert_allclose(norms.project(p, eps, norm).numpy(), p.numpy(), atol=1e-9)
    inside = d * 1e-3
    np.testing.assert_allclose(norms.project(inside, eps, norm).numpy(), inside.numpy())


def test_l1_projection_matches_brute_force_qp():
    # The projection minimises ||v - w||_2 over the ball: no random ball point is closer.
    rng = np.random.default_rng(1)
    v = rng.normal(0, 1, (1, 6))
    w = norms.project_l1(tf.constant(v), 1.0).numpy()
    assert abs(np.abs(w).sum() - 1.0) < 1e-9
    for _ in range(2000):
        z = rng.normal(0, 1, (1, 6))
        z = z / np.abs(z).sum() * rng.uniform(0, 1)
        assert np.linalg.norm(v - z) >= np.linalg.norm(v - w) - 1e-12


@pytest.mark.parametrize("norm", NORMS)
def test_steepest_ascent_unit_norm_and_optimal(norm):
    g = tf.constant([[3.0, -1.0, 0.5, -3.0]], tf.float64)
    d = norms.steepest_ascent(g, norm)
    assert abs(float(norms.norm(d, norm)[0]) - 1.0) < 1e-12
    # no random unit vector does better
    rng = np.random.default_rng(0)
    best = float(tf.reduce_sum(g * d))
    for _ in range(500):
        z = tf.constant(rng.normal(0, 1, (1, 4)))
        z = z / norms.norm(z, norm)[:, None]
        assert float(tf.reduce_sum(g * z)) <= best + 1e-9
    if norm == "l1":  # ties share the mass
        np.testing.assert_allclose(d.numpy(), [[0.5, 0, 0, -0.5]])


@pytest.mark.parametrize("norm", NORMS)
def test_random_in_ball_inside_and_seeded(norm):
    a = norms.random_in_ball([50, 10], 0.3, norm, seed=3)
    b = norms.random_in_ball([50, 10], 0.3, norm, seed=3)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert np.all(norms.norm(a, norm).numpy() <= 0.3 + 1e-6)


def test_canonical_norm_aliases():
    assert norms.canonical_norm(np.inf) == "linf"
    assert norms.canonical_norm(2) == "l2"
    assert norms.canonical_norm("L1") == "l1"
    with pytest.raises(ValueError, match="norm"):
        norms.canonical_norm(3)


# ----------------------------------------------------------------------------- objectives


def test_objectives_known_values():
    z = tf.constant([[3.0, 1.0, 0.0, -1.0]])
    y = tf.constant([0])
    assert float(attacks.objectives.cw_margin(z, y)[0]) == pytest.approx(-2.0)
    assert float(attacks.objectives.cw_margin(z, tf.constant([1]), targeted=True)[0]) == \
        pytest.approx(-2.0)
    assert float(attacks.objectives.dlr(z, y)[0]) == pytest.approx(-(3 - 1) / (3 - 0))
    assert float(attacks.objectives.targeted_dlr(z, y, tf.constant([2]))[0]) == \
        pytest.approx(-(3 - 0) / (3 - 0.5 * (0 - 1)))
    # DLR is invariant to shift and positive scale of the logits
    assert float(attacks.objectives.dlr(5 * z + 2, y)[0]) == pytest.approx(
        float(attacks.objectives.dlr(z, y)[0]), rel=1e-5)


# ----------------------------------------------------------------------------- known answers


def test_fgsm_linear_is_eps_sign_w():
    w = np.array([1.0, -2.0, 0.5, -0.1], np.float32)
    model = Linear(w)
    x = np.full((3, 4), 0.5, np.float32)
    y = np.array([1, 1, 1])  # push toward class 0 -> increase x.w
    x_adv = attacks.fast_gradient_method(model, x, y, eps=0.1, clip_min=0.0, clip_max=1.0)
    np.testing.assert_allclose(x_adv.numpy() - x, np.tile(0.1 * np.sign(w), (3, 1)), atol=1e-6)
    # PGD on a linear model converges to the same corner
    x_pgd = attacks.projected_gradient_descent(model, x, y, eps=0.1, clip_min=0.0, clip_max=1.0,
                                               steps=10, seed=0)
    np.testing.assert_allclose(x_pgd.numpy() - x, np.tile(0.1 * np.sign(w), (3, 1)), atol=1e-6)


def test_fgm_l2_has_norm_exactly_eps_and_l1_moves_largest_weight():
    w = np.array([1.0, -2.0, 0.5, -0.1], np.float32)
    x = np.full((2, 4), 0.5, np.float32)
    x_adv = attacks.fast_gradient_method(Linear(w), x, [1, 1], eps=0.2, norm="l2", clip_min=0.0,
                                         clip_max=1.0)
    np.testing.assert_allclose(np.linalg.norm(x_adv.numpy() - x, axis=1), 0.2, rtol=1e-5)
    np.testing.assert_allclose((x_adv.numpy() - x)[0], 0.2 * w / np.linalg.norm(w), atol=1e-6)
    x1 = attacks.fast_gradient_method(Linear(w), x, [1, 1], eps=0.2, norm="l1", clip_min=0.0,
                                      clip_max=1.0)
    np.testing.assert_allclose((x1.numpy() - x)[0], [0, -0.2, 0, 0], atol=1e-6)


def test_targeted_flips_direction():
    w = np.array([1.0, -2.0], np.float32)
    x = np.full((1, 2), 0.5, np.float32)
    x_adv = attacks.fast_gradient_method(Linear(w), x, [1], eps=0.1, clip_min=0.0, clip_max=1.0,
                                         targeted=True)  # toward class 1 -> decrease x.w
    np.testing.assert_allclose(x_adv.numpy() - x, -0.1 * np.sign(w)[None], atol=1e-6)


# ----------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("name", list(ATTACK_FNS))
@pytest.mark.parametrize("norm", NORMS)
def test_invariants(name, norm):
    model = SmallNet()
    x = small_batch(32)
    x_copy = x.copy()
    eps = {"linf": 0.1, "l2": 0.5, "l1": 2.0}[norm]
    kw = dict(eps=eps, norm=norm, clip_min=0.0, clip_max=1.0, seed=7)
    x_adv = ATTACK_FNS[name](model, x, None, **kw).numpy()
    np.testing.assert_array_equal(x, x_copy)  # input unchanged
    assert x_adv.shape == x.shape and x_adv.dtype == x.dtype
    assert np.all(norms.norm(tf.constant(x_adv - x), norm).numpy() <= eps + 1e-6)
    assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
    again = ATTACK_FNS[name](model, x, None, **kw).numpy()
    np.testing.assert_array_equal(x_adv, again)  # deterministic for a fixed seed
    zero = ATTACK_FNS[name](model, x, None, **{**kw, "eps": 0.0}).numpy()
    np.testing.assert_array_equal(zero, x)
    assert model.training_seen == {False}


@pytest.mark.parametrize("norm", NORMS)
def test_untargeted_and_targeted_succeed_on_small_net(norm):
    model = SmallNet()
    x = small_batch(64)
    y = tf.argmax(model(x), axis=1).numpy()
    eps = {"linf": 0.3, "l2": 2.0, "l1": 8.0}[norm]
    kw = dict(eps=eps, norm=norm, clip_min=0.0, clip_max=1.0, seed=0, steps=20)
    x_adv = attacks.projected_gradient_descent(model, x, y, **kw)
    acc = np.mean(np.argmax(model(x_adv), 1) == y)
    assert acc < 0.5, acc
    t = (y + 1) % 5
    x_t = attacks.projected_gradient_descent(model, x, t, targeted=True, **kw)
    hit = np.mean(np.argmax(model(x_t), 1) == t)
    assert hit > 0.5, hit


def test_per_feature_bounds_and_float64():
    model = SmallNet()
    x = small_batch(8).astype(np.float64)
    lo = np.zeros((4, 4, 1))
    hi = np.full((4, 4, 1), 1.0)
    hi[0, 0, 0] = x[:, 0, 0, 0].max()  # pin one feature at its maximum observed value
    x_adv = attacks.projected_gradient_descent(model, x, None, eps=0.3, clip_min=lo, clip_max=hi,
                                               steps=5, seed=0).numpy()
    assert x_adv.dtype == np.float64
    assert np.all(x_adv <= hi[None] + 0) and np.all(x_adv >= 0)


def test_restarts_keep_per_example_worst_case():
    model = SmallNet()
    x = small_batch(32)
    y = tf.argmax(model(x), 1).numpy()
    kw = dict(eps=0.05, clip_min=0.0, clip_max=1.0, steps=3, objective="cw")
    runs = [attacks.projected_gradient_descent(model, x, y, seed=s, **kw) for s in range(3)]
    # with restarts the per-example margin is at least as good as each single run
    best = attacks.projected_gradient_descent(model, x, y, seed=0, restarts=4, **kw)
    m_best = attacks.objectives.cw_margin(model(best), y).numpy()
    m_first = attacks.objectives.cw_margin(model(runs[0]), y).numpy()
    assert np.all(m_best >= m_first - 1e-5)


def test_early_stop_freezes_broken_examples():
    model = SmallNet()
    x = small_batch(64)
    y = tf.argmax(model(x), 1).numpy()
    kw = dict(eps=0.3, clip_min=0.0, clip_max=1.0, steps=20, seed=0)
    res_es = attacks.PGD(early_stop=True, **kw).run(model, x, y)
    res = attacks.PGD(**kw).run(model, x, y)
    assert res_es.gradient_passes < res.gradient_passes
    assert np.all(np.argmax(model(res_es.x_adv), 1) != y) == np.all(
        np.argmax(model(res.x_adv), 1) != y)
    # frozen examples stay at their first successful point: the margin is small, not maximal
    m_es = attacks.objectives.cw_margin(model(res_es.x_adv), y).numpy()
    m = attacks.objectives.cw_margin(model(res.x_adv), y).numpy()
    assert m_es.mean() < m.mean()


def test_one_trace_per_signature():
    model = SmallNet()
    attack = attacks.PGD(eps=0.1, steps=3, clip_min=0.0, clip_max=1.0)
    attack(model, small_batch(16), None, seed=0)
    first = model.traces
    assert first >= 1
    for n, eps, s in [(16, 0.2, 1), (7, 0.05, 2), (33, 0.3, None)]:
        attack(model, small_batch(n), None, eps=eps, seed=s)
        attacks.projected_gradient_descent(model, small_batch(n), None, eps=eps, steps=3,
                                           clip_min=0.0, clip_max=1.0, step_size=0.01)
    assert model.traces == first
    for n, eps in [(5, 0.1), (12, 0.3)]:
        attacks.fast_gradient_method(model, small_batch(n), None, eps=eps, clip_min=0.0,
                                     clip_max=1.0)
    after_fgm = model.traces
    attacks.FGSM(eps=0.2)(model, small_batch(40), None, clip_min=0.0, clip_max=1.0)
    assert model.traces == after_fgm


def test_loss_fn_and_callable_objective_for_rl_reuse():
    # a plain differentiable function of the input: maximise ||x - c||^2 under L∞
    c = tf.constant([[0.2, 0.8]])

    def loss_fn(x):
        return tf.reduce_sum(tf.square(x - c), axis=1)

    x = tf.constant([[0.25, 0.75], [0.1, 0.9]])
    x_adv = attacks.projected_gradient_descent(None, x, eps=0.05, clip_min=None, clip_max=None,
                                               loss_fn=loss_fn, steps=10, seed=0, rand_init=False)
    np.testing.assert_allclose(x_adv.numpy(), [[0.3, 0.7], [0.05, 0.95]], atol=1e-6)

    # a policy-like model with a KL objective against clean probabilities passed as y
    model = SmallNet(classes=3)
    xs = small_batch(8)
    clean = tf.nn.softmax(model(xs))

    def kl(logits, p_clean):
        return tf.reduce_sum(p_clean * (tf.math.log(p_clean + 1e-12) - tf.nn.log_softmax(logits)),
                             axis=1)

    xa = attacks.projected_gradient_descent(model, xs, clean, eps=0.1, clip_min=0.0, clip_max=1.0,
                                            objective=kl, steps=5, seed=0)
    assert float(tf.reduce_mean(kl(model(xa), clean))) > 1e-3


def test_inside_tf_function():
    model = SmallNet()
    attack = attacks.PGD(eps=0.1, steps=3, clip_min=0.0, clip_max=1.0)

    @tf.function
    def step(x, y):
        return attack(model, x, y, seed=0)

    x = tf.constant(small_batch(8))
    y = tf.argmax(model(x), 1)
    x_adv = step(x, y)
    assert float(tf.reduce_max(tf.abs(x_adv - x))) <= 0.1 + 1e-6


def test_class_wrappers_config_round_trip():
    a = attacks.PGD(eps=0.1, steps=7, norm=2)
    assert a.get_config() == {"class_name": "PGD", "eps": 0.1, "steps": 7, "norm": "l2"}
    b = attacks.PGD.from_config(a.get_config())
    assert b.config == a.config
    assert a.replace(steps=3).config["steps"] == 3
    with pytest.raises(TypeError, match="stepz"):
        attacks.PGD(stepz=3)
    with pytest.raises(ValueError, match="norm"):
        attacks.FGSM(norm="l2")


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("name", list(ATTACK_FNS))
def test_bad_input_raises_naming_argument(name):
    model = SmallNet()
    x = small_batch(4)
    f = ATTACK_FNS[name]
    ok = dict(eps=0.1, clip_min=0.0, clip_max=1.0)
    with pytest.raises(ValueError, match="eps"):
        f(model, x, None, **{**ok, "eps": -0.1})
    with pytest.raises(ValueError, match="clip_min"):
        f(model, x, None, **{**ok, "clip_min": 1.0, "clip_max": 0.0})
    with pytest.raises(ValueError, match="x has values outside"):
        f(model, x + 2.0, None, **ok)
    bad = x.copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="x contains NaN"):
        f(model, bad, None, **ok)
    with pytest.raises(TypeError, match="x must be a floating"):
        f(model, (x * 255).astype(np.uint8), None, clip_min=0, clip_max=255, eps=1.0)
    with pytest.raises(ValueError, match="y has labels outside"):
        f(model, x, np.array([0, 1, 2, 9]), **ok)
    with pytest.raises(ValueError, match="y has 3 labels"):
        f(model, x, np.array([0, 1, 2]), **ok)
    with pytest.raises(TypeError, match="y must hold integer"):
        f(model, x, np.array([0.0, 1.0, 2.0, 3.0]), **ok)
    const = lambda z, training=False: tf.zeros([tf.shape(z)[0], 3]) + tf.Variable([1.0, 2, 3])  # noqa
    with pytest.raises(ValueError, match="model: the output does not depend"):
        f(const, x, None, **ok)
    assert model.traces == 0  # nothing was compiled


def test_softmax_output_warns():
    net = SmallNet()
    probs = lambda x, training=False: tf.nn.softmax(net(x))  # noqa: E731
    with pytest.warns(UserWarning, match="probabilities"):
        attacks.fast_gradient_method(probs, small_batch(4), None, eps=0.1, clip_min=0.0,
                                     clip_max=1.0)


def test_cache_holds_models_weakly_and_reuses_bound_methods():
    import gc
    import weakref

    net = SmallNet()
    ref = weakref.ref(net)
    attacks.projected_gradient_descent(net, small_batch(8), None, eps=0.1, steps=2, clip_min=0.0,
                                       clip_max=1.0)
    del net
    gc.collect()
    assert ref() is None  # the compiled loop did not keep the model alive

    class Policy:
        def __init__(self):
            self.net = SmallNet()

        def logits(self, x):
            return self.net(x)

    pol = Policy()
    for _ in range(3):  # a fresh bound-method object each call, one trace
        attacks.projected_gradient_descent(pol.logits, small_batch(8), None, eps=0.1, steps=2,
                                           clip_min=0.0, clip_max=1.0)
    assert pol.net.traces == 1


# ----------------------------------------------------------------------------- one engine


@pytest.mark.parametrize("cls", [attacks.FGM, attacks.FGSM, attacks.PGD, attacks.BIM, attacks.MIM,
                                 attacks.APGD, attacks.CarliniWagnerL2, attacks.DeepFool,
                                 attacks.Square])
def test_supports_early_stop_is_declared_truthfully(cls):
    import inspect

    takes = "early_stop" in inspect.signature(cls._run).parameters
    assert cls.supports_early_stop is takes
    assert attacks.Attack.supports_early_stop is False


def test_engine_loop_inside_tf_function_matches_pgd():
    """The engine's loop, called unvalidated inside another tf.function, gives PGD's answer."""
    from attacks._engine import iterative_loop

    model = Linear([1.0, -2.0, 0.5])
    x = tf.constant([[0.5, 0.5, 0.5], [0.2, 0.9, 0.4]])
    y = tf.constant([0, 1], tf.int64)
    expected = attacks.projected_gradient_descent(model, x, y, eps=0.1, clip_min=0.0,
                                                  clip_max=1.0, steps=4, seed=3)

    def value_fn(xa, y_, _):
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_, logits=model(xa)), \
            tf.zeros([tf.shape(xa)[0]], tf.bool)

    traces = []

    @tf.function
    def outer(x):
        traces.append(1)
        loop = iterative_loop(value_fn, norm="linf", steps=4)
        eps = tf.constant(0.1)
        x_adv, rows, _ = loop(x, y, y, eps, 2.5 * eps / 4.0, tf.constant(0.0), tf.constant(1.0),
                              attacks._base.seed_tensor(3))
        return x_adv, rows

    x_adv, rows = outer(x)
    outer(x + 0.01)
    assert len(traces) == 1 and int(rows) == 4 * 2
    np.testing.assert_allclose(x_adv.numpy(), expected.numpy(), atol=1e-6)
    # the optimum of a linear model: eps * sign(w) away from the label, inside the box
    np.testing.assert_allclose(x_adv.numpy()[0], [0.4, 0.6, 0.4], atol=1e-6)
