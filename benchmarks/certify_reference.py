"""robustgrad.bounds side by side with auto_LiRPA (an independent verifier), on the same weights.

auto_LiRPA (Verified-Intelligence/auto_LiRPA, PyTorch; Xu et al. 2020, "Automatic Perturbation
Analysis for Scalable Certified Robustness and Beyond") is not a dependency: it runs in a second
interpreter (``--torch-python``, a virtualenv with CPU ``torch`` and auto_LiRPA installed from a
*scratch copy* of its repository, ``pip install --no-deps`` plus ``packaging appdirs tqdm pyyaml
graphviz``: its setup pins torch < 2.9, and it runs under newer torch), never vendored here::

    git clone https://github.com/Verified-Intelligence/auto_LiRPA /tmp/lirpa   # scratch copy
    /path/to/torch-venv/bin/pip install --no-deps /tmp/lirpa
    /path/to/torch-venv/bin/pip install packaging appdirs tqdm pyyaml graphviz
    python benchmarks/certify_reference.py --torch-python /path/to/torch-venv/bin/python

Networks (Keras, trained ``--epochs`` epochs on the 8x8 digits so that the ReLUs' stability is
realistic): ``mlp`` (2 x 128 ReLU), ``mlp-deep`` (4 x 64 ReLU), ``cnn`` (conv 8x3x3 - conv
16x3x3 stride 2 - dense 64 - 10, ReLU, "valid" padding), ``mlp-tanh`` (2 x 64 tanh),
``cnn-maxpool`` (:func:`attacks.training.make_classifier`'s layers at width 8: conv 8 - conv 16 -
max-pool 2 - conv 32 - max-pool 2 - dense 32 - 10, 3x3 "same" convolutions, ReLU), ``cnn-pool-bn``
(conv 8 - batch norm - ReLU - average pool 2 - conv 16 - batch norm - ReLU - average pool 2 -
dense 64 - 10), ``residual`` (conv 8 - a
residual block of two 3x3 convolutions - a strided conv 16 - dense 64 - 10); on the 28x28 MNIST subset
(``--mnist``): ``cnn-large-28`` (CROWN-IBP's "DM-large" at a quarter of its widths: conv 16, 16,
32 stride 2, 32, 32 - dense 128 - 10) and ``residual-28``. ``--patches`` chooses how our
convolutional intermediate bounds are computed (auto, always patches, always dense). The Keras
weights go to a NumPy file; the torch side builds the equivalent module (NCHW convolutions,
flattening in NHWC order) and **the logits must agree** (max difference < 1e-5 in float64)
before anything else runs.

For each network and method (IBP, CROWN, CROWN-IBP), on the first ``--n`` digits test images
(a comma-separated list, e.g. ``32,128``, runs every row at each batch size), the
L-inf ball of radius ``--eps`` clipped to [0, 1] and the margin specification ``C`` (``z_y -
z_j``, merged into the last layer by both): the lower and upper bounds of both sides, in float64.
Ours runs twice for CROWN: as shipped (intermediate CROWN bounds intersected with IBP's) and with
the intersection off (``robustgrad.bounds._engine.INTERSECT_WITH_IBP = False``), which is
auto_LiRPA's definition of CROWN; ``crown (dense)`` is the latter against auto_LiRPA with
``sparse_intermediate_bounds`` off (every intermediate neuron by CROWN: by default it keeps IBP's
bounds for the neurons of a layer that are stable for every example of the batch, which loosens
the input bounds of a max pooling; ours refines every element a max pooling reads, so it is
tighter there, and equal to the dense reference). Printed: the max absolute difference of the bounds, the
entries where ours is tighter / looser (by more than 1e-7 relative), the verified fraction
(every margin's lower bound > 0) of each, and the time per call (median over ``--rounds``
interleaved rounds, one thread each side, after one untimed call of each side on the degenerate
box ``x..x``: the same shapes, our trace), wall and CPU, as a ratio ours / reference; at the
end, all rows as one Markdown table, with the largest relative difference ``|ours - ref| /
max(1, |ref|)``. ``--ref-chunk K`` makes the reference bound ``K`` examples per call (its
memory), its time summed over the calls.

alpha-CROWN (``--methods ...,alpha-crown``): ours (``method="alpha-crown"``) against auto_LiRPA's
``"CROWN-Optimized"`` with the same options (``--alpha-iterations`` 20, ``--alpha-lr`` 0.5, decay
0.98 per iteration, Adam, slopes initialised by CROWN, best bound kept; auto_LiRPA's early stop
after 10 iterations without gain is turned off so that both run every iteration). Equality is not
expected (the optimisers' trajectories differ: ours keeps the best bound per element, auto_LiRPA
per example; ours intersects the intermediate bounds with CROWN's). An extra line gives the mean
absolute difference, the mean of (our lower bounds - theirs) and each side's mean gain over its
own CROWN (lower bounds up plus upper bounds down).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[0:1] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import numpy as np  # noqa: E402

METHODS = {"ibp": "IBP", "crown": "CROWN", "crown-ibp": "CROWN-IBP",
           "alpha-crown": "CROWN-Optimized"}
NETS = ("mlp", "mlp-deep", "cnn", "mlp-tanh", "cnn-maxpool", "cnn-pool-bn", "residual",
        "cnn-large-28", "residual-28")

# The reference's side, run in the --torch-python interpreter; argv: weights.npz threads dtype.
# Commands on stdin, one JSON object a line; answers on stdout, one JSON object a line.
_TORCH_SCRIPT = r'''
import contextlib, json, resource, sys, time
import numpy as np
import torch
from auto_LiRPA import BoundedModule, BoundedTensor
from auto_LiRPA.perturbations import PerturbationLpNorm

data = np.load(sys.argv[1])
torch.set_num_threads(int(sys.argv[2]))
dtype = {"float32": torch.float32, "float64": torch.float64}[sys.argv[3]]
torch.set_default_dtype(dtype)


class NHWCFlatten(torch.nn.Module):
    def forward(self, x):
        return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)


class Residual(torch.nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)


def build(net):
    layers, pending = [], 0  # a zero padding goes into the next convolution's (its Pad op does
    for i in range(int(data[f"{net}__n"])):  # not convert under this torch)
        kind = str(data[f"{net}__kind{i}"])
        if kind in ("dense", "conv"):
            w = torch.tensor(data[f"{net}__w{i}"], dtype=dtype)
            b = torch.tensor(data[f"{net}__b{i}"], dtype=dtype)
        if kind == "dense":
            lin = torch.nn.Linear(w.shape[0], w.shape[1])
            lin.weight.data, lin.bias.data = w.T.contiguous(), b
            layers.append(lin)
        elif kind == "conv":
            stride, pad = int(data[f"{net}__s{i}"]), int(data[f"{net}__p{i}"])
            conv = torch.nn.Conv2d(w.shape[2], w.shape[3], w.shape[0], stride=stride,
                                   padding=pad + pending)
            pending = 0
            conv.weight.data, conv.bias.data = w.permute(3, 2, 0, 1).contiguous(), b
            layers.append(conv)
        elif kind == "maxpool":
            layers.append(torch.nn.MaxPool2d(int(data[f"{net}__k{i}"])))
        elif kind == "avgpool":
            layers.append(torch.nn.AvgPool2d(int(data[f"{net}__k{i}"])))
        elif kind == "bn":  # inference: the moving statistics
            gamma, beta, mean, var = (torch.tensor(data[f"{net}__bn{i}_{k}"], dtype=dtype)
                                      for k in ("gamma", "beta", "mean", "var"))
            bn = torch.nn.BatchNorm2d(gamma.shape[0], eps=float(data[f"{net}__eps{i}"]))
            bn.weight.data, bn.bias.data = gamma, beta
            bn.running_mean.data, bn.running_var.data = mean, var
            layers.append(bn)
        elif kind == "flatten":
            layers.append(NHWCFlatten())
        elif kind == "zeropad":
            pending = int(data[f"{net}__p{i}"])
        elif kind == "residual":
            layers.append(Residual(build(f"{net}.{i}")))
        elif kind == "relu":
            layers.append(torch.nn.ReLU())
        elif kind == "tanh":
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers).to(dtype).eval()


nets = [str(n) for n in data["nets"]]
boxes = {}
for size in {int(data[f"{net}__size"]) for net in nets}:
    boxes[size] = [torch.tensor(data[f"{k}{size}"], dtype=dtype).permute(0, 3, 1, 2)  # NCHW
                   for k in ("x", "lower", "upper")] + [torch.tensor(data[f"C{size}"], dtype=dtype)]
modules, bounded = {}, {}
for net in nets:
    x = boxes[int(data[f"{net}__size"])][0]
    modules[net] = build(net)
    bounded[net] = BoundedModule(modules[net], torch.zeros_like(x[:1]), device="cpu",
                                 verbose=False)
print(json.dumps({net: modules[net](boxes[int(data[f"{net}__size"])][0]).detach().numpy().tolist()
                  for net in nets}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    net, method, reps, n = cmd["net"], cmd["method"], cmd["reps"], cmd["n"]
    x, lower, upper, C = (t[:n] for t in boxes[int(data[f"{net}__size"])])
    if cmd.get("point"):  # the warm-up: a degenerate box
        lower = upper = x
    optimized = method == "CROWN-Optimized"  # its optimiser needs autograd
    module = bounded[net]
    if cmd.get("dense"):  # every intermediate neuron by CROWN (no IBP for the stable ones)
        key = net + "/dense"
        if key not in bounded:
            bounded[key] = BoundedModule(modules[net], torch.zeros_like(x[:1]), device="cpu",
                                         verbose=False,
                                         bound_opts={"sparse_intermediate_bounds": False})
        module = bounded[key]
    if optimized:
        module.set_bound_opts({"optimize_bound_args": cmd["opts"]})
    times, cpus = [], []
    chunk = cmd.get("chunk") or n  # examples per call (its memory), times summed
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        lbs, ubs = [], []
        for s in range(0, n, chunk):
            ptb = PerturbationLpNorm(norm=float("inf"), x_L=lower[s:s + chunk],
                                     x_U=upper[s:s + chunk])
            with contextlib.nullcontext() if optimized else torch.no_grad(), \
                    contextlib.redirect_stdout(sys.stderr):  # its messages: not on the JSON pipe
                lb, ub = module.compute_bounds(x=(BoundedTensor(x[s:s + chunk], ptb),),
                                               method=method, C=C[s:s + chunk])
            lbs.append(lb.detach())
            ubs.append(ub.detach())
        lb, ub = torch.cat(lbs), torch.cat(ubs)
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    print(json.dumps({"lb": lb.numpy().tolist(), "ub": ub.numpy().tolist(), "times": times,
                      "cpus": cpus, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}),
          flush=True)
'''


def _residual(*layers):
    """A residual block ``x + body(x)`` in a layer list of :func:`build_nets`."""
    return ("residual", list(layers))


def _keras_net(keras, shape, layers):
    """A functional Keras model of a layer list (residual blocks as ``Add``)."""
    def apply(h, items):
        for item in items:
            h = keras.layers.Add()([h, apply(h, item[1])]) if isinstance(item, tuple) \
                else item(h)
        return h

    inp = keras.Input(shape)
    return keras.Model(inp, apply(inp, layers))


def _describe(name, layers, arrays):
    """The torch side's description of a layer list (weights read from the built layers)."""
    import keras

    L = keras.layers  # noqa: N806
    i = 0
    for layer in layers:
        if isinstance(layer, tuple):
            arrays[f"{name}__kind{i}"] = "residual"
            _describe(f"{name}.{i}", layer[1], arrays)
            i += 1
            continue
        if isinstance(layer, L.Flatten):
            arrays[f"{name}__kind{i}"] = "flatten"
            i += 1
            continue
        if isinstance(layer, L.ZeroPadding2D):
            (top, bottom), (left, right) = layer.padding
            assert top == bottom == left == right
            arrays[f"{name}__kind{i}"], arrays[f"{name}__p{i}"] = "zeropad", top
            i += 1
            continue
        if isinstance(layer, (L.MaxPooling2D, L.AveragePooling2D)):
            assert layer.pool_size[0] == layer.strides[0] and layer.padding == "valid"
            arrays[f"{name}__kind{i}"] = "maxpool" if isinstance(layer, L.MaxPooling2D) \
                else "avgpool"
            arrays[f"{name}__k{i}"] = layer.pool_size[0]
            i += 1
            continue
        if isinstance(layer, L.ReLU):
            arrays[f"{name}__kind{i}"] = "relu"
            i += 1
            continue
        if isinstance(layer, L.BatchNormalization):
            arrays[f"{name}__kind{i}"], arrays[f"{name}__eps{i}"] = "bn", layer.epsilon
            for key, v in zip(("gamma", "beta", "mean", "var"), layer.get_weights()):
                arrays[f"{name}__bn{i}_{key}"] = v
            i += 1
            continue
        w, b = layer.get_weights()
        arrays[f"{name}__kind{i}"] = "dense" if isinstance(layer, L.Dense) else "conv"
        arrays[f"{name}__w{i}"], arrays[f"{name}__b{i}"] = w, b
        if isinstance(layer, L.Conv2D):
            arrays[f"{name}__s{i}"] = layer.strides[0]
            arrays[f"{name}__p{i}"] = layer.kernel_size[0] // 2 if layer.padding == "same" \
                else 0  # odd kernels, stride 1 with "same"
            assert layer.padding == "valid" or layer.strides[0] == 1
        i += 1
        act = layer.activation.__name__
        if act != "linear":
            arrays[f"{name}__kind{i}"] = act
            i += 1
    arrays[f"{name}__n"] = i


def load_mnist(path):
    """The 28x28 digits of ``--mnist`` (``../shared/data/mnist_digits10k.npz``), in [0, 1]."""
    d = np.load(path)
    return ((d["x_train"][..., None] / 255.0).astype(np.float32), d["y_train"],
            (d["x_test"][..., None] / 255.0).astype(np.float32), d["y_test"])


def build_nets(epochs, names, mnist=None):
    """The Keras networks, trained on digits (8x8, or the 28x28 MNIST subset ``mnist`` for the
    ``-28`` nets), and their layer descriptions for the torch side."""
    import keras

    from robustgrad.data import load_digits

    L = keras.layers  # noqa: N806
    conv = lambda f, **kw: L.Conv2D(f, 3, padding="same", activation="relu", **kw)  # noqa: E731
    down = lambda f: [L.ZeroPadding2D(1), L.Conv2D(f, 3, strides=2, activation="relu")]  # noqa: E731
    specs = {
        "mlp": [L.Flatten(), L.Dense(128, activation="relu"), L.Dense(128, activation="relu"),
                L.Dense(10)],
        "mlp-deep": [L.Flatten()] + [L.Dense(64, activation="relu") for _ in range(4)]
                    + [L.Dense(10)],
        "cnn": [L.Conv2D(8, 3, activation="relu"), L.Conv2D(16, 3, strides=2, activation="relu"),
                L.Flatten(), L.Dense(64, activation="relu"), L.Dense(10)],
        "mlp-tanh": [L.Flatten(), L.Dense(64, activation="tanh"), L.Dense(64, activation="tanh"),
                     L.Dense(10)],
        # attacks.make_classifier's layers at width 8 (3x3 "same" convolutions, 2x2 max pooling)
        "cnn-maxpool": [conv(8), conv(16), L.MaxPooling2D(2), conv(32), L.MaxPooling2D(2),
                        L.Flatten(), L.Dense(32, activation="relu"), L.Dense(10)],
        # convolutions with batch normalisation (inference) and average pooling
        "cnn-pool-bn": [L.Conv2D(8, 3, padding="same"), L.BatchNormalization(), L.ReLU(),
                        L.AveragePooling2D(2), L.Conv2D(16, 3, padding="same"),
                        L.BatchNormalization(), L.ReLU(), L.AveragePooling2D(2), L.Flatten(),
                        L.Dense(64, activation="relu"), L.Dense(10)],
        # a residual block between convolutions
        "residual": [conv(8), _residual(conv(8), L.Conv2D(8, 3, padding="same")), *down(16),
                     L.Flatten(), L.Dense(64, activation="relu"), L.Dense(10)],
        # CROWN-IBP's "DM-large" CNN (Zhang et al. 2020) at a quarter of its widths, 28x28
        "cnn-large-28": [conv(16), conv(16), *down(32), conv(32), conv(32), L.Flatten(),
                         L.Dense(128, activation="relu"), L.Dense(10)],
        "residual-28": [conv(8), *down(16), _residual(conv(16), L.Conv2D(16, 3, padding="same")),
                        *down(16), L.Flatten(), L.Dense(64, activation="relu"), L.Dense(10)],
    }
    nets, arrays = {}, {}
    for name in names:
        layers = specs[name]
        size = 28 if name.endswith("-28") else 8
        if size == 28:
            x_train, y_train = mnist[0], mnist[1]
        else:
            (x_train, y_train), _ = load_digits()
        keras.utils.set_random_seed(0)
        model = _keras_net(keras, (size, size, 1), layers)
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x_train, y_train, epochs=epochs, batch_size=32, verbose=0)
        nets[name] = model
        _describe(name, layers, arrays)
        arrays[f"{name}__size"] = size
    return nets, arrays


def compare(ours, ref):
    """Max |difference|, and how many entries of (lb, ub) each side has tighter."""
    (olb, oub), (rlb, rub) = ours, ref
    tol = 1e-7 * (1 + np.maximum(np.abs(rlb), np.abs(rub)))
    tighter = int(np.sum(olb > rlb + tol) + np.sum(oub < rub - tol))
    looser = int(np.sum(olb < rlb - tol) + np.sum(oub > rub + tol))
    diff = max(float(np.max(np.abs(olb - rlb))), float(np.max(np.abs(oub - rub))))
    return diff, tighter, looser, olb.size * 2


def _alpha_details(name, ours, ref, crown):
    """alpha-CROWN's extra line: mean |difference| and each side's mean gain over its CROWN."""
    mean = float(np.mean(np.abs(np.concatenate([ours[0] - ref[0], ours[1] - ref[1]]))))
    lower_gap = float(np.mean(ours[0] - ref[0]))
    line = (f"{name:<9} alpha-crown    mean|diff| {mean:.2e}  mean(lb ours - lb ref) "
            f"{lower_gap:+.2e}")
    if crown is not None:
        (olb, oub), (rlb, rub) = crown
        line += (f"  mean gain over CROWN (lb up + ub down): ours "
                 f"{float(np.mean(ours[0] - olb) + np.mean(oub - ours[1])):.3e}, ref "
                 f"{float(np.mean(ref[0] - rlb) + np.mean(rub - ref[1])):.3e}")
    print(line, flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch-python", required=True)
    parser.add_argument("--n", default="50", help="examples per call; a comma-separated list "
                        "(e.g. 32,128) runs every row at each batch size")
    parser.add_argument("--eps", type=float, default=0.02)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--mnist", default="../shared/data/mnist_digits10k.npz",
                        help="the 28x28 digits of the '-28' nets")
    parser.add_argument("--patches", default="auto", choices=("auto", "on", "off"),
                        help="our convolutional intermediate bounds by patches: where smaller "
                        "(auto), wherever possible, never")
    parser.add_argument("--ref-chunk", type=int, default=None,
                        help="the reference bounds at most this many examples per call (its "
                        "memory: auto_LiRPA's CROWN on cnn-large-28 takes more than 18 GB at "
                        "32 examples), its time summed over the calls; ours takes the batch whole")
    parser.add_argument("--alpha-iterations", type=int, default=20)
    parser.add_argument("--alpha-lr", type=float, default=0.5)
    parser.add_argument("--methods", default="ibp,crown-ibp,crown,crown-pure,crown-dense,"
                        "alpha-crown", help="rows: ibp, crown-ibp, crown (∩ IBP), crown-pure, "
                        "crown-dense (crown-pure against the reference with sparse_intermediate_"
                        "bounds off), alpha-crown")
    args = parser.parse_args(argv)
    batches = [int(v) for v in args.n.split(",")]

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    from robustgrad.bounds import BoundedModel, _engine, margin_spec
    from robustgrad.data import load_digits

    _engine.PATCHES = {"auto": None, "on": True, "off": False}[args.patches]
    names = [n for n in args.nets.split(",")]
    mnist = load_mnist(args.mnist) if any(n.endswith("-28") for n in names) else None
    _, (x8, y8) = load_digits()
    npdt = np.dtype(args.dtype)
    data = {}  # input size -> x, lower, upper, spec (the first max(--n) test images)
    for size, (xs, ys) in {8: (x8, y8), 28: (mnist[2], mnist[3]) if mnist else (None, None)}.items():
        if xs is None:
            continue
        x, y = xs[:max(batches)], ys[:max(batches)]
        data[size] = (x, np.clip(x - args.eps, 0, 1), np.clip(x + args.eps, 0, 1),
                      margin_spec(y, 10, dtype=tf.float64).numpy())
    nets, arrays = build_nets(args.epochs, names, mnist)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "weights.npz")
        boxes = {f"{k}{size}": v.astype(npdt) for size, d in data.items()
                 for k, v in zip(("x", "lower", "upper", "C"), d)}
        np.savez(path, nets=np.array(names), **boxes, **arrays)
        proc = subprocess.Popen([args.torch_python, "-c", _TORCH_SCRIPT, path, str(args.threads),
                                 args.dtype], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        logits = json.loads(proc.stdout.readline())
        for name in names:
            x = data[int(arrays[f"{name}__size"])][0]
            ours = nets[name](x.astype(np.float32)).numpy()
            gap = float(np.max(np.abs(np.asarray(logits[name]) - ours)))
            assert gap < 1e-4, f"{name}: the ported logits differ by {gap}"
            print(f"{name}: ported logits agree (max |diff| {gap:.1e}, float32 Keras vs "
                  f"{args.dtype} torch)")

        # auto_LiRPA's alpha-CROWN with our options; its early stop (no gain in 10 iterations)
        # is off so that both run the same number of iterations; lr decay 0.98 on both sides
        opts = {"iteration": args.alpha_iterations, "lr_alpha": args.alpha_lr, "lr_decay": 0.98,
                "init_alpha": True, "optimizer": "adam", "keep_best": True,
                "early_stop_patience": 10 ** 9}

        def reference(name, method, n, dense=False, point=False):
            proc.stdin.write(json.dumps({"net": name, "method": METHODS[method], "opts": opts,
                                         "reps": 1, "dense": dense, "n": n,
                                         "point": point, "chunk": args.ref_chunk}) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the reference process died on {name} {method} at batch "
                                   f"{n} (exit code {proc.wait()}; out of memory?)")
            r = json.loads(line)
            return ((np.asarray(r["lb"]), np.asarray(r["ub"])), r["times"][0], r["cpus"][0],
                    r["peak_kb"])

        every = {"ibp": ("ibp", True), "crown-ibp": ("crown-ibp", True), "crown": ("crown", True),
                 "crown-pure": ("crown", False), "crown-dense": ("crown", None),
                 "alpha-crown": ("alpha-crown", True)}
        variants = [every[m] for m in args.methods.split(",")]
        alpha_kw = {"iterations": args.alpha_iterations, "lr": args.alpha_lr}
        rows, crown_rows = [], {}
        for n, name in [(n, name) for name in names for n in batches]:
            _, lower, upper, spec = data[int(arrays[f"{name}__size"])]
            tlo, thi = tf.constant(lower[:n].astype(npdt)), tf.constant(upper[:n].astype(npdt))
            tspec = tf.constant(spec[:n].astype(npdt))
            tx = tf.constant(data[int(arrays[f"{name}__size"])][0][:n].astype(npdt))
            for method, intersect in variants:
                _engine.INTERSECT_WITH_IBP = bool(intersect)
                dense = intersect is None  # the reference without its sparse intermediate bounds
                bm = BoundedModel(nets[name])  # a fresh trace reads the flag
                kw = alpha_kw if method == "alpha-crown" else {}

                def ours_call(lo=tlo, hi=thi, bm=bm, kw=kw, tspec=tspec, method=method):
                    lb, ub = bm.bounds(lo, hi, method, tspec, batch_size=None, **kw)
                    return lb.numpy(), ub.numpy()

                # warm-up (our trace; both sides' first call) on the degenerate box x..x: the
                # same shapes, no unstable neuron, so it costs a forward pass or two
                ours_call(tx, tx)
                reference(name, method, n, dense, point=True)
                times = {"ours": [], "ref": [], "ours_cpu": [], "ref_cpu": []}
                for _ in range(args.rounds):
                    t0, c0 = time.perf_counter(), time.process_time()
                    ours_b = ours_call()
                    times["ours"].append(time.perf_counter() - t0)
                    times["ours_cpu"].append(time.process_time() - c0)
                    ref_b, t, c, peak_kb = reference(name, method, n, dense)
                    times["ref"].append(t)
                    times["ref_cpu"].append(c)
                med = {k: statistics.median(v) for k, v in times.items()}
                diff, tighter, looser, total = compare(ours_b, ref_b)
                rel = relative_difference(ours_b, ref_b)
                verified = (float(np.mean(np.all(ours_b[0] > 0, 1))),
                            float(np.mean(np.all(ref_b[0] > 0, 1))))
                label = method if method != "crown" else \
                    {True: "crown (∩ IBP)", False: "crown (pure)", None: "crown (dense)"}[intersect]
                peaks = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20,
                         peak_kb / 2 ** 20)
                rows.append((name, n, label, diff, rel, tighter, looser, total, verified, med,
                             peaks))
                print(f"{name:<9} B={n:<4} {label:<14} max|diff| {diff:.2e} (rel {rel:.1e})  "
                      f"ours tighter {tighter:>4}/{total} looser {looser:>4}/{total}  verified "
                      f"{verified[0]:.2f} vs {verified[1]:.2f}  wall {1e3 * med['ours']:.1f} ms "
                      f"vs {1e3 * med['ref']:.1f} ms ({med['ours'] / med['ref']:.2f}x)  cpu "
                      f"{med['ours_cpu'] / max(med['ref_cpu'], 1e-9):.2f}x  peak RSS so far "
                      f"{peaks[0]:.1f} / {peaks[1]:.1f} GB", flush=True)
                if method == "crown" and intersect:
                    crown_rows[name, n] = (ours_b, ref_b)
                if method == "alpha-crown":
                    _alpha_details(name, ours_b, ref_b, crown_rows.get((name, n)))
        _engine.INTERSECT_WITH_IBP = True
        proc.stdin.close()
        proc.wait()
    footer = (f"eps {args.eps} (L-inf, clipped to [0, 1]), {args.dtype}, margin spec, "
              f"{args.threads} thread(s) each side, median of {args.rounds} interleaved rounds; "
              f"load average {os.getloadavg()[0]:.1f}")
    print(footer)
    print_table(rows)


def relative_difference(ours, ref):
    """The largest ``|ours - ref| / max(1, |ref|)`` over both bounds (relative for bounds above 1
    in magnitude, absolute below)."""
    return max(float(np.max(np.abs(o - r) / np.maximum(1.0, np.abs(r))))
               for o, r in zip(ours, ref))


def print_table(rows):
    """The rows as one Markdown table (time ratios ours / reference, wall and CPU)."""
    print("\n| network | batch | method | max rel. diff | ours tighter / looser | verified ours / "
          "ref | wall ours / ref | CPU ours / ref |\n|---|---:|---|---:|---:|---:|---:|---:|")
    for name, n, label, _, rel, tighter, looser, total, verified, med, _ in rows:
        wall = med["ours"] / med["ref"]
        cpu = med["ours_cpu"] / max(med["ref_cpu"], 1e-9)
        print(f"| {name} | {n} | {label} | {rel:.0e} | {tighter} / {looser} (of {total}) | "
              f"{verified[0]:.2f} / {verified[1]:.2f} | **{wall:.2f}x** ({_ms(med['ours'])} vs "
              f"{_ms(med['ref'])}) | {cpu:.2f}x |")


def _ms(seconds):
    return f"{1e3 * seconds:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"

if __name__ == "__main__":
    main()
