"""AutoAttack in TensorFlow side by side with the reference implementation, on the same weights.

The reference (fra31/auto-attack, PyTorch) is not a dependency: it runs in a second interpreter
(``--torch-python``, a virtualenv with CPU ``torch`` and ``numpy``) with a *scratch copy* of its
``autoattack`` package on that interpreter's ``PYTHONPATH`` (``--reference``: the directory that
holds ``autoattack/``), never vendored here::

    python -m venv /tmp/torch && /tmp/torch/bin/pip install numpy torch \\
        --index-url https://download.pytorch.org/whl/cpu
    git clone https://github.com/fra31/auto-attack /tmp/aa-ref     # read-only scratch copy
    python benchmarks/autoattack_reference.py --torch-python /tmp/torch/bin/python \\
        --reference /tmp/aa-ref --models digits digits-adv mnist --n 50

For each model (``digits``: the plain 8x8 digits CNN of :mod:`attacks.reference`; ``digits-adv``:
the same CNN trained with PGD-7 at L∞ 0.1 for 15 epochs; ``mnist``: a larger CNN, 2 convolutions
of 32 and 64 channels and a 128-unit layer, trained for 3 epochs on the 8,000 training images of
``../shared/data/mnist_digits10k.npz`` — 28x28 real MNIST digits, *not* the official split, see
its README; only this benchmark reads it), the Keras weights are written to a NumPy file, the
torch side builds the equivalent module (NCHW convolutions with TensorFlow's "same" padding,
flattening in NHWC order) and **asserts that its logits equal Keras's** (max difference below
1e-4) before anything else runs. Then both run AutoAttack ``--version`` (``standard`` by default)
on the first ``--n`` test examples at each ``--eps`` with ``--norm``, each on ``--threads``
threads:

* ours: :func:`attacks.cascade.run_cascade` with ``attacks.parse_attacks("autoattack", norm)``
  (:func:`attacks.evaluate` without its extra sanity checks, which the reference does not run),
  timed twice: cold (tracing included) and warm;
* the reference: ``AutoAttack(model, norm, eps, version, device="cpu", seed=0)
  .run_standard_evaluation(x, y, bs=250)``; an example is robust when the model still classifies
  its returned point correctly.

Printed per model and eps: robust accuracy of both, per-example agreement, the examples the
reference breaks and ours calls robust (the dangerous direction), and wall time ours / reference.
Goals (issue 23, section 4): robust accuracy within 0.5 points, dangerous direction at most 0.5%
of the examples, ours at most 1.0x the reference's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[0:1] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import numpy as np  # noqa: E402

MNIST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared",
                     "data", "mnist_digits10k.npz")
DEFAULT_EPS = {"digits": [0.1], "digits-adv": [0.15], "mnist": [0.1]}
"""L∞ budgets where the models' robust accuracy is neither 0 nor their clean accuracy."""

# The reference's side, run in the --torch-python interpreter; argv: weights.npz threads.
_TORCH_SCRIPT = r'''
import json, sys, time
import numpy as np
import torch
import torch.nn.functional as F
from autoattack import AutoAttack

data = np.load(sys.argv[1])
torch.set_num_threads(int(sys.argv[2]))
n_layers = int(data["n_layers"])


class Ported(torch.nn.Module):
    """The Keras Sequential (Conv2D* -> Flatten -> Dense*), NCHW in, logits out."""

    def __init__(self):
        super().__init__()
        self.layers = []
        for i in range(n_layers):
            kind = str(data[f"kind{i}"])
            w = torch.tensor(data[f"w{i}"])
            b = torch.tensor(data[f"b{i}"])
            if kind == "conv":  # Keras HWIO -> torch OIHW
                w = w.permute(3, 2, 0, 1).contiguous()
            else:  # Keras [in, out] -> torch [out, in]
                w = w.t().contiguous()
            self.register_buffer(f"w{i}", w)
            self.register_buffer(f"b{i}", b)
            self.layers.append((kind, int(data[f"stride{i}"]), bool(data[f"relu{i}"])))

    def forward(self, x):
        flat = False
        for i, (kind, stride, relu) in enumerate(self.layers):
            w, b = getattr(self, f"w{i}"), getattr(self, f"b{i}")
            if kind == "conv":
                k = w.shape[-1]
                pads = []
                for size in (x.shape[3], x.shape[2]):  # TensorFlow "same": extra pad at the end
                    out = -(-size // stride)
                    total = max((out - 1) * stride + k - size, 0)
                    pads += [total // 2, total - total // 2]
                x = F.conv2d(F.pad(x, pads), w, b, stride=stride)
            else:
                if not flat:  # Keras flattens NHWC
                    x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)
                    flat = True
                x = F.linear(x, w, b)
            if relu:
                x = torch.relu(x)
        return x


model = Ported().eval()
x = torch.tensor(data["x"]).permute(0, 3, 1, 2).contiguous()
y = torch.tensor(data["y"])
with torch.no_grad():
    logits = model(x).numpy()
diff = float(np.abs(logits - data["logits"]).max())
assert diff < 1e-4, f"ported logits differ from Keras's by {diff}"
out = {"logit_diff": diff, "runs": []}
for eps in data["eps"].tolist():
    adversary = AutoAttack(model, norm=str(data["norm"]), eps=eps, version=str(data["version"]),
                           device="cpu", seed=0, verbose=False)
    start = time.perf_counter()
    x_adv = adversary.run_standard_evaluation(x, y, bs=250)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        robust = (model(x_adv).argmax(1) == y).numpy()
    out["runs"].append({"eps": eps, "robust": robust.tolist(), "seconds": seconds})
print(json.dumps(out))
'''


def _set_threads(threads: int) -> None:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def _mnist_cnn(seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])


def build_model(name: str):
    """``(keras model, x_test, y_test)`` for a model name (trained here, seeded)."""
    import keras

    from attacks import training
    from attacks.reference import digits_cnn, train_digits_cnn
    from robustgrad.data import load_digits

    if name in ("digits", "digits-adv"):
        (x_tr, y_tr), (x_te, y_te) = load_digits()
        if name == "digits":
            return train_digits_cnn(epochs=15, seed=0), x_te, y_te
        model = digits_cnn(seed=0)
        trainer = training.AdversarialTrainer(model, method="madry", eps=0.1, steps=7)
        trainer.compile(optimizer=keras.optimizers.Adam(3e-3))
        trainer.fit(x_tr, y_tr, epochs=15, batch_size=64, verbose=0)
        return model, x_te, y_te
    data = np.load(MNIST)
    x_tr = (data["x_train"].astype(np.float32) / 255.0)[..., None]
    x_te = (data["x_test"].astype(np.float32) / 255.0)[..., None]
    model = _mnist_cnn()
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x_tr, data["y_train"], epochs=3, batch_size=64, verbose=0)
    return model, x_te, data["y_test"].astype(np.int64)


def export(model, x, y, logits, eps, norm, version, path):
    """The model's layers (Conv2D, Flatten, Dense only), the examples and the settings as npz."""
    import keras

    arrays = {"x": x, "y": y, "logits": logits, "eps": np.asarray(eps, np.float64),
              "norm": {"linf": "Linf", "l2": "L2", "l1": "L1"}[norm], "version": version}
    i = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Flatten):
            continue
        if not isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense)):
            raise ValueError(f"cannot port layer {layer.name}")
        kernel, bias = (np.asarray(v) for v in layer.get_weights())
        activation = layer.activation.__name__
        if activation not in ("relu", "linear"):
            raise ValueError(f"cannot port activation {activation}")
        if isinstance(layer, keras.layers.Conv2D) and layer.padding != "same":
            raise ValueError("only 'same' padding is ported")
        arrays.update({f"kind{i}": "conv" if isinstance(layer, keras.layers.Conv2D) else "dense",
                       f"w{i}": kernel, f"b{i}": bias, f"relu{i}": activation == "relu",
                       f"stride{i}": (layer.strides[0]
                                      if isinstance(layer, keras.layers.Conv2D) else 1)})
        i += 1
    arrays["n_layers"] = i
    np.savez(path, **arrays)


def ours(model, x, y, eps, norm, version):
    """Per eps (each run on its own, as the reference's): ``[(cold robust flags, cold seconds,
    warm robust flags, warm seconds)]`` of our cascade; cold includes tracing."""
    import attacks
    from attacks.cascade import run_cascade

    name = {"standard": "autoattack"}.get(version, "autoattack-" + version)
    out = []
    for budget in eps:
        runs = []
        for _ in range(2):
            start = time.perf_counter()
            (outcome,) = run_cascade(model, x, y, attacks.parse_attacks(name, norm=norm),
                                     [budget], norm=norm, clip_min=0.0, clip_max=1.0,
                                     batch_size=250, seed=0)
            runs += [outcome.robust, time.perf_counter() - start]
        out.append(tuple(runs))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--torch-python", required=True, help="interpreter with torch and numpy")
    p.add_argument("--reference", required=True,
                   help="directory holding the reference's autoattack/ package (a scratch copy)")
    p.add_argument("--models", nargs="+", default=["digits", "digits-adv", "mnist"],
                   choices=["digits", "digits-adv", "mnist"])
    p.add_argument("--n", type=int, default=50, help="test examples per model (default 50)")
    p.add_argument("--eps", type=float, nargs="+", default=None,
                   help="budgets (default per model: " + json.dumps(DEFAULT_EPS) + ")")
    p.add_argument("--norm", default="linf", choices=["linf", "l2", "l1"])
    p.add_argument("--version", default="standard", choices=["standard", "plus", "rand"])
    p.add_argument("--threads", type=int, default=1, help="threads on both sides (default 1)")
    args = p.parse_args(argv)
    _set_threads(args.threads)
    if not os.path.isdir(os.path.join(args.reference, "autoattack")):
        p.error(f"--reference: no autoattack/ package under {args.reference}")

    rows = []
    for name in args.models:
        model, x_te, y_te = build_model(name)
        x, y = x_te[: args.n].astype(np.float32), np.asarray(y_te[: args.n], np.int64)
        logits = np.asarray(model(x))
        eps = args.eps or DEFAULT_EPS[name]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "weights.npz")
            export(model, x, y, logits, eps, args.norm, args.version, path)
            env = {**os.environ, "PYTHONPATH": os.path.abspath(args.reference),
                   "OMP_NUM_THREADS": str(args.threads)}
            done = subprocess.run([args.torch_python, "-c", _TORCH_SCRIPT, path,
                                   str(args.threads)], capture_output=True, text=True, env=env,
                                  cwd=tmp)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            reference = json.loads(done.stdout.strip().splitlines()[-1])
        our_runs = ours(model, x, y, eps, args.norm, args.version)
        clean = float(np.mean(logits.argmax(1) == y))
        print(f"{name}: {len(x)} examples, clean accuracy {clean:.3f}, ported logits within "
              f"{reference['logit_diff']:.1e}")
        for k, run in enumerate(reference["runs"]):
            ref_robust = np.asarray(run["robust"], bool)
            cold_flags, cold, our_robust, warm = our_runs[k]
            row = dict(model=name, eps=run["eps"], n=len(x), ours=float(our_robust.mean()),
                       reference=float(ref_robust.mean()),
                       agreement=float(np.mean(our_robust == ref_robust)),
                       dangerous=int(np.sum(our_robust & ~ref_robust)),
                       cold_same=bool(np.array_equal(cold_flags, our_robust)),
                       ours_seconds=warm, ours_cold_seconds=cold,
                       reference_seconds=run["seconds"])
            rows.append(row)
            print(f"  eps {row['eps']:g}: robust accuracy ours {row['ours']:.3f} reference "
                  f"{row['reference']:.3f}; agreement {row['agreement']:.3f}; reference breaks, "
                  f"ours robust: {row['dangerous']}; wall ours/reference "
                  f"{row['ours_seconds'] / row['reference_seconds']:.2f}x warm "
                  f"({row['ours_cold_seconds'] / row['reference_seconds']:.2f}x cold), "
                  f"reference {row['reference_seconds']:.1f} s", flush=True)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
