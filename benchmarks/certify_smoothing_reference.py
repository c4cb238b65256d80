"""Randomized smoothing against Cohen et al.'s own code, on the same weights and examples.

The reference is ``Smooth.certify`` of ``code/core.py`` in locuslab/smoothing (Cohen, Rosenfeld &
Kolter, "Certified Adversarial Robustness via Randomized Smoothing", ICML 2019), run unmodified
from a *scratch copy* of the repository (``--ref-code``) by a second interpreter
(``--ref-python``: a virtualenv with CPU ``torch``, ``scipy`` and ``statsmodels``; none of them
is a project dependency). Two shims, applied in that interpreter only, let the GPU-era file run
on this CPU with today's scipy: ``torch.randn_like(..., device='cuda')`` drops the device
argument, and ``scipy.stats.binom_test`` (removed in scipy 1.12; only ``Smooth.predict`` uses it)
is bound to ``binomtest(...).pvalue``::

    git -C /path/to/locuslab-smoothing archive HEAD code | tar -x -C /work/scratch-smooth/ref
    python benchmarks/certify_smoothing_reference.py --ref-python /path/to/venv/bin/python \\
        --ref-code /work/scratch-smooth/ref/code        # ~2.5 min on 2 cores

Both sides certify the same base classifier: the digits CNN of ``train-classifier`` (arch
``cnn``, width ``--width``) trained here with Gaussian noise of std ``--sigma`` for ``--epochs``
epochs, its weights ported to a PyTorch twin (NCHW convolutions, flattening in NHWC order);
**the logits must agree** (max difference < 1e-4, on clean and on noisy inputs) before anything
else runs. The first ``--n-examples`` digits test images are certified one at a time on both
sides (Cohen's ``certify`` takes one image), with the same ``sigma``, ``n0``, ``n``, ``alpha`` and
``--batch-size`` noisy inputs per forward pass, one thread each side, for ``--seeds`` seeds,
the two sides interleaved seed by seed.

The noise draws differ between the frameworks, so the comparison is statistical: per example and
seed, whether both sides took the same decision (the same class, or both abstain); per example,
the difference of the mean radii over the seeds against its sampling spread (the standard error
from the within-side spread over seeds; a difference beyond 3 standard errors is counted), and
the mean difference over all examples with its standard error (a systematic bias). Time per
example: median over seeds, wall and CPU, ours / reference; ours batched (all examples in one
call, the library's normal use) is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[0:1] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import numpy as np  # noqa: E402

# The reference's side, run by --ref-python; argv: weights.npz, the scratch copy's code/ dir,
# threads. Commands on stdin (one JSON object a line), answers on stdout (one a line).
_REF_SCRIPT = r'''
import json, sys, time
import numpy as np
import scipy.stats
import torch
from torch import nn

data = np.load(sys.argv[1])
torch.set_num_threads(int(sys.argv[3]))
_randn_like = torch.randn_like
torch.randn_like = lambda t, *a, device=None, **k: _randn_like(t, *a, **k)  # CPU: no 'cuda'
if not hasattr(scipy.stats, "binom_test"):  # removed in scipy 1.12; only Smooth.predict uses it
    scipy.stats.binom_test = lambda k, n, p=0.5: scipy.stats.binomtest(k, n, p).pvalue
sys.path.insert(0, sys.argv[2])
from core import Smooth  # noqa: E402  (Cohen et al.'s code/core.py, unmodified)


class Twin(nn.Module):
    """attacks.training.make_classifier: 3 conv (3x3 same) + 2 max-pools + 2 dense, ReLU."""

    def __init__(self):
        super().__init__()
        k = {n: torch.tensor(data[n]) for n in data.files}
        self.convs = nn.ModuleList()
        for name in ("conv1", "conv2", "conv3"):
            w = k[name + "/kernel"].permute(3, 2, 0, 1)  # HWIO -> OIHW
            conv = nn.Conv2d(w.shape[1], w.shape[0], 3, padding=1)
            conv.weight.data, conv.bias.data = w.contiguous(), k[name + "/bias"]
            self.convs.append(conv)
        self.dense = nn.ModuleList()
        for name in ("dense1", "logits"):
            w = k[name + "/kernel"].t()
            lin = nn.Linear(w.shape[1], w.shape[0])
            lin.weight.data, lin.bias.data = w.contiguous(), k[name + "/bias"]
            self.dense.append(lin)

    def forward(self, x):  # NCHW
        r, pool = torch.relu, nn.functional.max_pool2d
        x = pool(r(self.convs[1](r(self.convs[0](x)))), 2)
        x = pool(r(self.convs[2](x)), 2)
        x = x.permute(0, 2, 3, 1).flatten(1)  # NHWC order, as Keras flattens
        return self.dense[1](r(self.dense[0](x)))


model = Twin().eval()
with torch.no_grad():
    diffs = [float((model(torch.tensor(data[a]).permute(0, 3, 1, 2)) - torch.tensor(data[b]))
                   .abs().max()) for a, b in (("x", "logits"), ("x_noisy", "logits_noisy"))]
print(json.dumps({"max_logit_diff": max(diffs)}), flush=True)
x = torch.tensor(data["x"]).permute(0, 3, 1, 2).contiguous()
for line in sys.stdin:
    cmd = json.loads(line)
    torch.manual_seed(cmd["seed"])
    smooth = Smooth(model, 10, cmd["sigma"])
    labels, radii, walls, cpus = [], [], [], []
    for i in range(cmd.get("limit", len(x))):
        t0, c0 = time.perf_counter(), time.process_time()
        label, radius = smooth.certify(x[i], cmd["n0"], cmd["n"], cmd["alpha"], cmd["batch"])
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        labels.append(int(label))
        radii.append(float(radius))
    print(json.dumps({"labels": labels, "radii": radii, "wall": sum(walls), "cpu": sum(cpus)}),
          flush=True)
'''


def train_base(args, x_train, y_train):
    import keras

    from attacks import training

    keras.utils.set_random_seed(0)
    model = training.make_classifier((8, 8), 10, width=args.width)
    tr = training.AdversarialTrainer(model, method="gaussian", eps=args.sigma, eval_steps=0)
    tr.compile(optimizer=keras.optimizers.Adam(1e-3))
    tr.fit(x_train, y_train, batch_size=64, epochs=args.epochs, verbose=0)
    return model


def export(model, x, path):
    noisy = (x + 0.5 * np.random.default_rng(1).normal(size=x.shape)).astype(np.float32)
    arrays = {"x": x, "logits": model(x).numpy(), "x_noisy": noisy,
              "logits_noisy": model(noisy).numpy()}
    for layer in model.layers:
        for var, kind in zip(layer.weights, ("kernel", "bias")):
            arrays[f"{layer.name}/{kind}"] = np.asarray(var.numpy(), np.float32)
    np.savez(path, **arrays)


def ours(model, x, args, seed):
    """Per-example smooth_certify calls: (labels, radii, wall, cpu); then one batched call."""
    from attacks.certify import smooth_certify

    kw = {"n0": args.n0, "n": args.n, "alpha": args.alpha, "batch_size": args.batch_size}
    labels, radii = [], []
    for part in (x[:1], x):  # trace both shapes before timing
        smooth_certify(model, part, args.sigma, seed=0, n0=args.n0, n=args.n0,
                       batch_size=args.batch_size)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(len(x)):
        lab, rad = smooth_certify(model, x[i:i + 1], args.sigma, seed=seed * 100_003 + i, **kw)
        labels.append(int(lab[0]))
        radii.append(float(rad[0]))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    smooth_certify(model, x, args.sigma, seed=seed, **kw)
    batched = (time.perf_counter() - t0, time.process_time() - c0)
    return np.array(labels), np.array(radii), wall, cpu, batched


def compare(ours_runs, ref_runs, y):
    """The statistical comparison (see the module doc) as a dict."""
    lo, lr = np.array([r[0] for r in ours_runs]), np.array([r[0] for r in ref_runs])  # [S, N]
    ro, rr = np.array([r[1] for r in ours_runs]), np.array([r[1] for r in ref_runs])
    k = len(ours_runs)
    se = np.sqrt(ro.var(0, ddof=1) / k + rr.var(0, ddof=1) / k)
    diff = ro.mean(0) - rr.mean(0)
    beyond = np.where(se > 0, np.abs(diff) > 3 * se, np.abs(diff) > 1e-9)
    return {
        "decision_agreement": float(np.mean(lo == lr)),
        "abstain_ours": float(np.mean(lo == -1)), "abstain_ref": float(np.mean(lr == -1)),
        "accuracy_ours": float(np.mean(lo == y)), "accuracy_ref": float(np.mean(lr == y)),
        "mean_radius_ours": float(ro.mean()), "mean_radius_ref": float(rr.mean()),
        "mean_abs_diff": float(np.abs(diff).mean()), "mean_se": float(se.mean()),
        "beyond_3se": int(beyond.sum()),
        "mean_diff": float(diff.mean()),
        "mean_diff_se": float(diff.std(ddof=1) / np.sqrt(len(diff))),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref-python", required=True)
    parser.add_argument("--ref-code", required=True, help="the scratch copy's code/ directory")
    parser.add_argument("--sigma", type=float, default=0.25)
    parser.add_argument("--n0", type=int, default=100)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--n-examples", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    from robustgrad.data import load_digits

    (x_train, y_train), (x_test, y_test) = load_digits()
    x, y = x_test[:args.n_examples].astype(np.float32), y_test[:args.n_examples]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
          f"{os.getloadavg()[0]:.1f}; sigma {args.sigma}, n0 {args.n0}, n {args.n}, alpha "
          f"{args.alpha}, batch {args.batch_size}; {len(y)} digits test images, {args.seeds} "
          f"seeds, {args.threads} thread(s) each side; cnn width {args.width}, gaussian "
          f"training {args.epochs} epochs", flush=True)
    model = train_base(args, x_train, y_train)
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "weights.npz")
        export(model, x, weights)
        script = os.path.join(tmp, "ref.py")
        with open(script, "w") as f:
            f.write(_REF_SCRIPT)
        ref = subprocess.Popen([args.ref_python, script, weights, args.ref_code,
                                str(args.threads)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
        check = json.loads(ref.stdout.readline())
        print(f"max |logit difference| Keras vs the PyTorch twin: {check['max_logit_diff']:.2e}")
        if not check["max_logit_diff"] < 1e-4:
            ref.kill()
            raise SystemExit("the ported weights do not give the same logits: stopping")
        ref.stdin.write(json.dumps({"seed": 0, "sigma": args.sigma, "n0": args.n0,
                                    "n": args.n0, "alpha": args.alpha, "batch": args.batch_size,
                                    "limit": 1}) + "\n")  # warm-up, not timed
        ref.stdin.flush()
        ref.stdout.readline()
        ours_runs, ref_runs, times = [], [], {"ours": [], "ref": [], "batched": []}
        for seed in range(args.seeds):
            labels, radii, wall, cpu, batched = ours(model, x, args, seed)
            ours_runs.append((labels, radii))
            times["ours"].append((wall, cpu))
            times["batched"].append(batched)
            ref.stdin.write(json.dumps({"seed": seed, "sigma": args.sigma, "n0": args.n0,
                                        "n": args.n, "alpha": args.alpha,
                                        "batch": args.batch_size}) + "\n")
            ref.stdin.flush()
            out = json.loads(ref.stdout.readline())
            ref_runs.append((np.array(out["labels"]), np.array(out["radii"])))
            times["ref"].append((out["wall"], out["cpu"]))
            print(f"seed {seed}: ours {wall:.1f} s wall {cpu:.1f} s CPU, reference "
                  f"{out['wall']:.1f} s wall {out['cpu']:.1f} s CPU", flush=True)
        ref.stdin.close()
        ref.wait()
    stats = compare(ours_runs, ref_runs, y)
    per = {k: [statistics.median(t[i] for t in v) / len(y) for i in (0, 1)]
           for k, v in times.items()}
    print(json.dumps(stats, indent=1))
    print(f"time per example (median over seeds): ours {per['ours'][0] * 1e3:.1f} ms wall "
          f"{per['ours'][1] * 1e3:.1f} ms CPU; reference {per['ref'][0] * 1e3:.1f} ms wall "
          f"{per['ref'][1] * 1e3:.1f} ms CPU; ratio ours/reference wall "
          f"{per['ours'][0] / per['ref'][0]:.2f}, CPU {per['ours'][1] / per['ref'][1]:.2f}; "
          f"ours batched {per['batched'][0] * 1e3:.1f} ms wall "
          f"{per['batched'][1] * 1e3:.1f} ms CPU ({per['batched'][0] / per['ref'][0]:.2f}x "
          f"the reference's wall)")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
