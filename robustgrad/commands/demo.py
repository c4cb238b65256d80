"""``robustgrad demo``: the main job on the embedded defaults.

Runs the core demonstration (gradient of a Keras model, Hessian-vector products, a chunked
Jacobian, clipped gradients in a compiled train step), then the attacks stage
(:mod:`robustgrad.commands._demo_attacks`: a plain and an adversarially trained digits
classifier under the same attacks) and the agents stage
(:mod:`robustgrad.commands._demo_agents`: PPO and SA-PPO on CartPole under the same observation
attacks); ``summary.png`` puts both comparisons side by side.

Example::

    robustgrad demo --out runs/demo     # a few minutes on 2 cores; outputs under runs/demo/
"""

from __future__ import annotations

import time
from pathlib import Path

from robustgrad.atomic import save_figure

HELP = "run the main job on the embedded defaults (digits, CartPole)"



def add_arguments(parser) -> None:
    parser.add_argument("--out", default="runs/demo",
                        help="output directory (default: runs/demo; the demo's own earlier "
                             "outputs there are replaced)")
    parser.add_argument("--core-only", action="store_true", help="run only the core demonstration")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _say(msg: str) -> None:
    print(msg, flush=True)


def core_demo(seed: int = 0) -> dict:
    """The core demonstration; returns the figures it printed."""
    import keras

    from robustgrad.data import load_digits

    keras.utils.set_random_seed(seed)
    (x_train, y_train), (x_test, y_test) = load_digits()
    _say(f"[core] digits: {len(x_train)} train / {len(x_test)} test images of 8x8, 10 classes")
    model = keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10),
    ])
    diff = _derivatives(model, x_train, y_train, x_test, seed)
    loss, acc = _train_with_clipping(model, x_train, y_train, x_test, y_test)
    return {"loss": loss, "test_accuracy": acc, "hvp_mode_diff": diff}


def _derivatives(model, x_train, y_train, x_test, seed: int) -> float:
    """value_and_grad, the two HVP modes and the chunked per-example Jacobian of the CNN;
    returns the largest difference between the HVP modes."""
    import numpy as np
    import tensorflow as tf

    import robustgrad as rg
    from robustgrad import monitor

    xb, yb = tf.constant(x_train[:128]), tf.constant(y_train[:128])
    ntv = [v.value for v in model.non_trainable_variables]

    def loss_of_params(params):
        logits, _ = model.stateless_call(params, ntv, xb, training=False)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, logits))

    params = [tf.convert_to_tensor(v.value) for v in model.trainable_variables]
    loss, grads = rg.value_and_grad(loss_of_params)(params)
    stats = monitor.gradient_stats(grads, model.trainable_variables)
    _say(f"[core] value_and_grad of the CNN's loss: loss={float(loss):.4f}, "
         f"global gradient norm={float(stats['global_norm']):.4f} over {len(grads)} variables")

    rng = np.random.default_rng(seed)
    v = [tf.constant(rng.standard_normal(p.shape), p.dtype) for p in params]
    hv_f = rg.hvp(loss_of_params, (params,), (v,), mode="forward_over_reverse")[0]
    hv_r = rg.hvp(loss_of_params, (params,), (v,), mode="reverse_over_reverse")[0]
    diff = max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(hv_f, hv_r))
    curv = sum(float(tf.reduce_sum(a * b)) for a, b in zip(v, hv_f))
    _say(f"[core] Hessian-vector product: v'Hv={curv:.4f}; forward-over-reverse and "
         f"reverse-over-reverse agree to {diff:.1e}")

    x64 = tf.constant(x_test[:64])
    t0 = time.perf_counter()
    j_chunked = rg.batch_jacobian(model, x64, chunk_size=2)
    t1 = time.perf_counter()
    j_full = rg.batch_jacobian(model, x64)
    same = float(tf.reduce_max(tf.abs(j_chunked - j_full)))
    _say(f"[core] per-example Jacobian d logits / d input: shape {tuple(j_chunked.shape)}, "
         f"2 classes at a time in {t1 - t0:.2f}s, equal to the unchunked one (max diff {same:.1e})")
    return diff


def _train_with_clipping(model, x_train, y_train, x_test, y_test) -> tuple[float, float]:
    """Three epochs with global-norm clipping and a non-finite guard
    (:class:`robustgrad.transforms.GradientStep`); returns the last loss and test accuracy."""
    import keras
    import numpy as np
    import tensorflow as tf

    from robustgrad import transforms
    from robustgrad.data import make_dataset

    chain = transforms.apply_if_finite(transforms.clip_by_global_norm(1.0),
                                       max_nonfinite_steps=5)
    optimizer = keras.optimizers.Adam(1e-2)
    step = transforms.GradientStep(chain, optimizer, model.trainable_variables)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        g = tape.gradient(loss, model.trainable_variables)
        return loss, step(g)

    for epoch in range(3):
        norms = []
        for x, y in make_dataset(x_train, y_train, batch_size=64, seed=epoch):
            loss, info = train_step(x, y)
            norms.append(float(info["grad_norm"]))
        acc = float(np.mean(np.argmax(model(x_test), -1) == y_test))
        _say(f"[core] epoch {epoch + 1}: loss={float(loss):.3f}, gradient norm before clipping "
             f"mean={np.mean(norms):.2f} max={np.max(norms):.2f} (clipped to 1.0), "
             f"test accuracy={acc:.3f}")
    return float(loss), acc


def plot_summary(classifiers: dict, agents_: dict, path) -> str:
    """One figure: robust accuracy vs eps of both classifiers, return vs eps of both agents."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("plain", "plain CNN"), ("robust", "fast adversarial training")):
        if key in classifiers:
            left.plot(classifiers["eps"], classifiers[key], "o-", label=label)
    left.set(xlabel="L∞ eps (pixels in [0, 1])", ylabel="worst-case robust accuracy",
             title="digits classifiers", ylim=(0, 1.02))
    left.legend()
    for key, label in (("vanilla", "PPO"), ("sa", "SA-PPO")):
        right.plot(agents_["eps"], agents_[key], "o-", label=label)
    right.set(xlabel="L∞ eps (raw observation units)", ylabel="worst-case mean return",
              title="CartPole-v1 agents", ylim=(0, 510))
    right.legend()
    fig.tight_layout()
    save_figure(fig, path)
    return str(path)


def validate(args) -> None:
    """Before TensorFlow loads: ``--seed`` in NumPy's range, ``--out`` a writable directory (or
    new)."""
    from robustgrad.cli import user_errors
    from robustgrad.commands._bounds import MAX_SEED, count
    from robustgrad.commands._files import check_output_dir

    with user_errors(ValueError):
        count(args.seed, "--seed", MAX_SEED, minimum=0)
    check_output_dir(args.out, "--out", overwrite=True)


def run(args) -> int:
    from robustgrad.commands import _demo_agents, _demo_attacks

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    core_demo(args.seed)
    if not args.core_only:
        _say("[demo] --- attacks ---")
        report = _demo_attacks.run(out)
        classifiers = _demo_attacks.run_robust(out, plain_report=report)
        _say("[demo] --- agents ---")
        result = _demo_agents.run(out, seed=args.seed, progress=not args.no_progress)
        agent_curves = _demo_agents.run_robust(out, result["out"], seed=args.seed,
                                               progress=not args.no_progress)
        _say(f"[demo] summary figure: {plot_summary(classifiers, agent_curves, out / 'summary.png')}")
    _say(f"[demo] done in {time.perf_counter() - t0:.1f}s; outputs under {out}/")
    return 0
