"""FAB (attacks.fab): the exact boundary projection, minimal distortion on linear models,
the box, targeted runs, FAB-T, the robustness mode with eps, chunking, validation."""

import numpy as np
import pytest
import tensorflow as tf

import attacks
from attacks.fab import boundary_projection

from small_models import Linear, SmallNet, small_batch

BOX = dict(clip_min=0.0, clip_max=1.0)
NORMS = ("linf", "l2", "l1")


def _dist(d, norm):
    d = np.asarray(d, np.float64).reshape(len(d), -1)
    return {"linf": np.abs(d).max(1), "l2": np.linalg.norm(d, axis=1),
            "l1": np.abs(d).sum(1)}[norm]


def _min_norm_step(t, w, r, lo, hi, norm):
    """The smallest ||d|| with <w, d> = r and lo <= t + d <= hi, by scipy (LP for L1 / L∞, SLSQP
    for L2); None when infeasible."""
    optimize = pytest.importorskip("scipy.optimize")
    n = len(t)
    bounds = list(zip(lo - t, hi - t))
    if norm == "l2":
        res = optimize.minimize(lambda d: d @ d, np.zeros(n), jac=lambda d: 2 * d,
                                constraints=[{"type": "eq", "fun": lambda d: w @ d - r,
                                              "jac": lambda d: w}],
                                bounds=bounds, method="SLSQP", options={"ftol": 1e-14,
                                                                        "maxiter": 500})
        return res.x if res.success and abs(w @ res.x - r) < 1e-8 else None
    if norm == "l1":  # d = p - q, p, q >= 0, minimise sum(p + q)
        c = np.ones(2 * n)
        a_eq = np.concatenate([w, -w])[None]
        bnds = [(0, max(u, 0)) for _, u in bounds] + [(0, max(-lo_, 0)) for lo_, _ in bounds]
        res = optimize.linprog(c, A_eq=a_eq, b_eq=[r], bounds=bnds, method="highs")
        return res.x[:n] - res.x[n:] if res.status == 0 else None
    # linf: variables (d, s), minimise s with -s <= d_i <= s
    c = np.concatenate([np.zeros(n), [1.0]])
    a_ub = np.block([[np.eye(n), -np.ones((n, 1))], [-np.eye(n), -np.ones((n, 1))]])
    res = optimize.linprog(c, A_ub=a_ub, b_ub=np.zeros(2 * n),
                           A_eq=np.concatenate([w, [0.0]])[None], b_eq=[r],
                           bounds=bounds + [(0, None)], method="highs")
    return res.x[:n] if res.status == 0 else None


@pytest.mark.parametrize("norm", NORMS)
def test_boundary_projection_is_the_smallest_step_onto_the_plane_inside_the_box(norm):
    rng = np.random.default_rng(0)
    n_rows, n = 40, 6
    t = rng.uniform(0.0, 1.0, (n_rows, n))
    w = rng.normal(0, 1, (n_rows, n))
    w[rng.uniform(size=(n_rows, n)) < 0.15] = 0.0  # some coordinates the plane ignores
    lo = t - rng.uniform(0.0, 0.5, (n_rows, n))  # a per-feature box around t, some at a bound
    hi = t + rng.uniform(0.0, 0.5, (n_rows, n))
    at_bound = rng.uniform(size=(n_rows, n)) < 0.1
    lo[at_bound] = t[at_bound]
    r = rng.normal(0, 0.6, n_rows)
    d = boundary_projection(*(tf.constant(a, tf.float64) for a in (t, w, r, lo, hi)),
                            norm=norm).numpy()
    assert np.all(t + d >= lo - 1e-12) and np.all(t + d <= hi + 1e-12)
    feasible = 0
    for i in range(n_rows):
        ref = _min_norm_step(t[i], w[i], r[i], lo[i], hi[i], norm)
        if ref is None:  # out of reach: the corner that moves <w, .> the most toward r
            corner = np.where(w[i] * np.sign(r[i]) > 0, hi[i] - t[i], lo[i] - t[i])
            corner[w[i] == 0] = 0.0
            np.testing.assert_allclose(d[i], corner, atol=1e-12)
            continue
        feasible += 1
        assert w[i] @ d[i] == pytest.approx(r[i], abs=1e-9)
        assert _dist(d[i:i + 1], norm)[0] == pytest.approx(_dist(ref[None], norm)[0], abs=1e-7)
    assert feasible >= 20  # both branches are exercised


@pytest.mark.parametrize("norm", NORMS)
def test_fab_finds_the_analytic_minimal_perturbation_of_a_linear_model(norm):
    # logits [s, -s] with s = x.w: the boundary is x.w = 0; x.w = 0.05 here (class 0)
    w = np.array([1.0, -2.0, 0.5], np.float32)
    x = np.array([[0.6, 0.4, 0.5]], np.float32)
    s = float((x @ w)[0])
    optimal = {  # the minimal-norm step reaching x.w = 0, far from the box
        "l2": -s * w / np.dot(w, w),
        "linf": -s * np.sign(w) / np.abs(w).sum(),
        "l1": np.array([0.0, -s / w[1], 0.0]),
    }[norm]
    x_adv = attacks.fab(Linear(w), x, norm=norm, **BOX).numpy()
    assert np.argmax(Linear(w)(x_adv), 1)[0] == 1
    ratio = _dist(x_adv - x, norm)[0] / _dist(optimal[None], norm)[0]
    assert 1.0 <= ratio < 1.01  # adversarial, so never below the minimum; FAB gets within 1%
    np.testing.assert_allclose(x_adv[0] - x[0], ratio * optimal, atol=1e-5)  # and the direction


@pytest.mark.parametrize("norm", NORMS)
def test_fab_respects_a_binding_per_feature_box_and_finds_its_minimum(norm):
    # the cheapest coordinate (|w| largest) has little room: the optimum uses the others
    w = np.array([1.0, -3.0, 0.5, 2.0], np.float32)
    x = np.array([[0.5, 0.3, 0.5, 0.5]], np.float32)  # x.w = 0.6 -> class 0
    lo = np.array([0.0, 0.25, 0.0, 0.0], np.float32)
    hi = np.array([1.0, 1.0, 1.0, 0.6], np.float32)
    x_adv = attacks.fab(Linear(w), x, norm=norm, clip_min=lo, clip_max=hi, steps=200).numpy()
    assert np.all(x_adv >= lo) and np.all(x_adv <= hi)
    assert np.argmax(Linear(w)(x_adv), 1)[0] == 1
    ref = _min_norm_step(x[0].astype(np.float64), w.astype(np.float64), -float((x @ w)[0]), lo, hi,
                         norm)
    ratio = _dist(x_adv - x, norm)[0] / _dist(ref[None], norm)[0]
    assert 1.0 - 1e-5 <= ratio < 1.02


@pytest.mark.parametrize("norm", NORMS)
def test_fab_invariants_on_a_small_net(norm):
    model = SmallNet()
    x = small_batch(32)
    x_copy = x.copy()
    y = np.argmax(model(x), 1)
    x_adv = attacks.fab(model, x, norm=norm, steps=30, **BOX).numpy()
    np.testing.assert_array_equal(x, x_copy)
    assert x_adv.shape == x.shape and x_adv.dtype == x.dtype
    assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
    assert np.mean(np.argmax(model(x_adv), 1) != y) == 1.0  # minimal mode: every point flipped
    # with eps: broken only within eps, x elsewhere; a larger eps never breaks fewer
    dist = _dist(x_adv - x, norm)
    eps = float(np.median(dist))
    x_eps = attacks.fab(model, x, eps=eps, norm=norm, steps=30, **BOX).numpy()
    d_eps = _dist(x_eps - x, norm)
    assert np.all(d_eps <= eps + 1e-6)
    broken = np.argmax(model(x_eps), 1) != y
    np.testing.assert_array_equal(x_eps[~broken], x[~broken])
    assert broken.sum() == np.sum(dist <= eps)  # the same runs, judged at eps
    assert model.training_seen == {False}


@pytest.mark.parametrize("norm", NORMS)
def test_targeted_fab_reaches_the_targets(norm):
    model = SmallNet()
    x = small_batch(32)
    y = np.argmax(model(x), 1)
    targets = (y + 2) % 5
    x_adv = attacks.fab(model, x, targets, targeted=True, norm=norm, steps=60, **BOX).numpy()
    reached = np.argmax(model(x_adv), 1) == targets
    assert reached.mean() >= 0.9
    np.testing.assert_array_equal(x_adv[~reached], x[~reached])  # none found: x


def test_fab_t_and_restarts_keep_the_smallest_point():
    model = SmallNet()
    x = small_batch(32)
    y = np.argmax(model(x), 1)
    one = attacks.fab(model, x, norm="l2", steps=30, n_target_classes=1, **BOX).numpy()
    three = attacks.fab(model, x, norm="l2", steps=30, n_target_classes=3, **BOX).numpy()
    for x_adv in (one, three):
        assert np.all(np.argmax(model(x_adv), 1) != y)
    # the first target's run is among the three: never farther
    assert np.all(_dist(three - x, "l2") <= _dist(one - x, "l2") + 1e-6)
    r1 = attacks.fab(model, x, eps=0.3, norm="l2", steps=20, restarts=1, seed=0, **BOX)
    r3 = attacks.fab(model, x, eps=0.3, norm="l2", steps=20, restarts=3, seed=0, **BOX)
    broken = [np.argmax(model(r), 1) != y for r in (r1, r3)]
    assert np.all(broken[1] >= broken[0])  # restart 0 is the same run
    np.testing.assert_array_equal(r3.numpy(), attacks.fab(model, x, eps=0.3, norm="l2", steps=20,
                                                          restarts=3, seed=0, **BOX).numpy())


def test_fab_counts_its_passes_and_chunks():
    model = SmallNet()
    x = small_batch(10)
    y = np.arange(10) % 5
    run = attacks.FAB(norm="linf", steps=4).run(model, x, y, **BOX)
    assert run.gradient_passes == 10 * 5 * 4  # the Jacobian of 5 logits per step
    assert run.forward_passes == 10 + 10 * 4  # the clean pass and one check per step
    run_t = attacks.FAB(norm="linf", steps=4, n_target_classes=2).run(model, x, y, **BOX)
    assert run_t.gradient_passes == 10 * 4 * 2
    chunked = attacks.fab(model, x, y, norm="linf", steps=4, batch_size=3, **BOX).numpy()
    np.testing.assert_allclose(chunked, run.x_adv.numpy(), atol=2e-7)


def test_fab_traces_once_per_configuration():
    model = SmallNet()
    attacks.fab(model, small_batch(8), eps=0.2, steps=3, **BOX)
    first = model.traces
    attacks.fab(model, small_batch(5, seed=2), eps=0.1, steps=3, **BOX)
    assert model.traces == first


def test_fab_bad_arguments_raise_before_any_work():
    model, x = SmallNet(), small_batch(4)
    with pytest.raises(ValueError, match="norm must be one of"):
        attacks.fab(model, x, norm="l0", **BOX)
    with pytest.raises(ValueError, match="norm"):
        attacks.FAB(norm="l3")
    with pytest.raises(ValueError, match=r"n_target_classes must be < the number of classes \(5\)"):
        attacks.fab(model, x, n_target_classes=5, **BOX)
    with pytest.raises(ValueError, match="n_target_classes must be < the number of classes"):
        attacks.FAB(n_target_classes=9).check_num_classes(5)
    with pytest.raises(ValueError, match="targeted: FAB-T"):
        attacks.fab(model, x, [0, 1, 2, 3], targeted=True, n_target_classes=2, **BOX)
    with pytest.raises(ValueError, match="eps: FAB's random restarts"):
        attacks.fab(model, x, restarts=2, **BOX)
    with pytest.raises(ValueError, match="beta must be in"):
        attacks.fab(model, x, beta=1.0, **BOX)
    with pytest.raises(ValueError, match="eta must be"):
        attacks.fab(model, x, eta=0.5, **BOX)
    assert model.traces == 0


def test_fab_compiles_with_xla_on_a_keras_cnn():
    import keras

    model = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(3, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(4)])
    x = np.random.default_rng(0).uniform(0, 1, (6, 6, 6, 1)).astype(np.float32)
    y = np.argmax(model(x), 1)
    plain = attacks.fab(model, x, norm="l1", steps=5, **BOX).numpy()
    xla = attacks.fab(model, x, norm="l1", steps=5, jit_compile=True, **BOX).numpy()
    assert np.all(np.argmax(model(xla), 1) != y) and np.all(np.argmax(model(plain), 1) != y)
    # float rounding differs under XLA and may flip the L1 step's choice of a coordinate
    assert np.median(_dist(xla - x, "l1")) == pytest.approx(np.median(_dist(plain - x, "l1")),
                                                            rel=0.05)
