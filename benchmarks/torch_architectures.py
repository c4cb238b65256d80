"""PyTorch twins of ``attacks.training.architectures`` and a check that ported weights give the
same logits (issue 26: figures against PyTorch need the same network on both sides).

The module has two roles, so that neither virtualenv needs the other's framework:

* in a virtualenv with ``torch`` (the reference side, never a project dependency): it defines
  :func:`preact_resnet18` and :func:`wide_resnet` as ``torch.nn.Module`` s whose sub-modules carry
  the Keras layer names, and :func:`load_keras_weights` ports an ``.npz`` of Keras weights;
* with ``--role keras`` under the project's Python: it builds the Keras models with
  ``attacks.training.make_model`` (random weights, batch-norm statistics moved by one training
  pass), and writes their weights, an input batch and the Keras logits to an ``.npz``.

Usage (from the repository root)::

    /path/to/torch-venv/bin/python benchmarks/torch_architectures.py \\
        --keras-python .venv/bin/python          # builds, ports, compares; prints max |diff|

Other scripts import :func:`preact_resnet18`, :func:`wide_resnet` and :func:`load_keras_weights`
to time the PyTorch side of a comparison on the same weights.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

# (arch, make_model options, input shape) checked by default: narrow, so the check takes seconds.
CASES = (
    ("preactresnet18", {"width": 8}, (32, 32, 3)),
    ("wrn-16-2", {}, (32, 32, 3)),
    ("preactresnet18", {"width": 4}, (28, 28, 1)),
)
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2471, 0.2435, 0.2616)


# ----------------------------------------------------------------------------------- Keras side

def export_keras(out: str) -> None:
    """Build every case with attacks.training.make_model and write weights, inputs and logits."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    import keras

    from attacks.training import make_model

    arrays = {}
    rng = np.random.default_rng(0)
    for i, (arch, options, shape) in enumerate(CASES):
        keras.utils.set_random_seed(i)
        channels = shape[-1]
        model = make_model(arch, shape, 10, mean=MEAN[:channels], std=STD[:channels], **options)
        x = rng.random((4, *shape), dtype="float32")
        model(x, training=True)  # batch-norm statistics away from their initial values
        for layer in model.layers:
            for w in layer.weights:
                arrays[f"{i}/{layer.name}/{w.name}"] = np.asarray(w.numpy())
        arrays[f"{i}/x"], arrays[f"{i}/logits"] = x, model(x, training=False).numpy()
    np.savez(out, **arrays)


# ----------------------------------------------------------------------------------- torch side

def _torch_modules():
    import torch
    from torch import nn

    class PreActBlock(nn.Module):
        """BN-ReLU-conv3x3(stride)-BN-ReLU-[dropout]-conv3x3 + shortcut (1x1 conv of the
        activated input when the shape changes)."""

        def __init__(self, cin, cout, stride, dropout, name):
            super().__init__()
            self.name = name
            self.layers = nn.ModuleDict({
                f"{name}_bn1": nn.BatchNorm2d(cin, momentum=0.1, eps=1e-5),
                f"{name}_conv1": nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                f"{name}_bn2": nn.BatchNorm2d(cout, momentum=0.1, eps=1e-5),
                f"{name}_conv2": nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            })
            if stride != 1 or cin != cout:
                self.layers[f"{name}_shortcut"] = nn.Conv2d(cin, cout, 1, stride, 0, bias=False)
            self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()

        def forward(self, x):
            m, n = self.layers, self.name
            act = torch.relu(m[f"{n}_bn1"](x))
            shortcut = m[f"{n}_shortcut"](act) if f"{n}_shortcut" in m else x
            out = torch.relu(m[f"{n}_bn2"](m[f"{n}_conv1"](act)))
            return m[f"{n}_conv2"](self.dropout(out)) + shortcut

    class Net(nn.Module):
        """stem conv, pre-activation blocks, BN-ReLU, global average pool, dense logits."""

        def __init__(self, in_channels, stem, stages, num_classes, mean, std, dropout=0.0):
            super().__init__()
            self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
            self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))
            self.layers = nn.ModuleDict({"stem_conv": nn.Conv2d(in_channels, stem, 3, 1, 1,
                                                                bias=False)})
            blocks, cin = [], stem
            for name, cout, stride in stages:
                blocks.append(PreActBlock(cin, cout, stride, dropout, name))
                cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.layers["final_bn"] = nn.BatchNorm2d(cin, momentum=0.1, eps=1e-5)
            self.layers["logits"] = nn.Linear(cin, num_classes)

        def forward(self, x):  # x: NCHW in pixel units
            out = self.layers["stem_conv"]((x - self.mean) / self.std)
            out = torch.relu(self.layers["final_bn"](self.blocks(out)))
            return self.layers["logits"](out.mean(dim=(2, 3)))

    return Net


def preact_resnet18(num_classes=10, width=64, in_channels=3, mean=MEAN, std=STD):
    """PyTorch PreActResNet-18 with the layer names of ``make_model("preactresnet18")``."""
    stages = [(f"stage{s}_block{b + 1}", width * mult, stride if b == 0 else 1)
              for s, (mult, stride) in enumerate(((1, 1), (2, 2), (4, 2), (8, 2)), start=1)
              for b in range(2)]
    return _torch_modules()(in_channels, width, stages, num_classes, mean[:in_channels],
                            std[:in_channels])


def wide_resnet(depth=28, widen_factor=10, num_classes=10, in_channels=3, dropout=0.0,
                mean=MEAN, std=STD):
    """PyTorch WideResNet with the layer names of ``make_model("wrn-<depth>-<widen>")``."""
    n = (depth - 4) // 6
    stages = [(f"group{g}_block{b + 1}", ch * widen_factor, stride if b == 0 else 1)
              for g, (ch, stride) in enumerate(((16, 1), (32, 2), (64, 2)), start=1)
              for b in range(n)]
    return _torch_modules()(in_channels, 16, stages, num_classes, mean[:in_channels],
                            std[:in_channels], dropout)


def load_keras_weights(module, weights: dict) -> int:
    """Copy Keras weights (``{"layer/variable": array}``) into ``module``; returns how many
    tensors were copied, and raises ``KeyError`` for a torch parameter without a Keras source."""
    import torch

    named = {}
    for mod_name, mod in module.named_modules():
        leaf = mod_name.split(".")[-1]
        named[leaf] = mod
    copied = 0
    for leaf, mod in named.items():
        if isinstance(mod, torch.nn.Conv2d):
            pairs = {"weight": (f"{leaf}/kernel", (3, 2, 0, 1))}
        elif isinstance(mod, torch.nn.Linear):
            pairs = {"weight": (f"{leaf}/kernel", (1, 0)), "bias": (f"{leaf}/bias", None)}
        elif isinstance(mod, torch.nn.BatchNorm2d):
            pairs = {"weight": (f"{leaf}/gamma", None), "bias": (f"{leaf}/beta", None),
                     "running_mean": (f"{leaf}/moving_mean", None),
                     "running_var": (f"{leaf}/moving_variance", None)}
        else:
            continue
        for attr, (key, perm) in pairs.items():
            value = weights[key]
            value = np.transpose(value, perm) if perm else value
            with torch.no_grad():
                getattr(mod, attr).copy_(torch.from_numpy(np.ascontiguousarray(value)))
            copied += 1
    return copied


def compare(keras_python: str) -> float:
    """Run the Keras side, port every case to PyTorch and return the largest logit difference."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "keras.npz")
        subprocess.run([keras_python, os.path.abspath(__file__), "--role", "keras", "--out", path],
                       check=True)
        data = dict(np.load(path))
    worst = 0.0
    for i, (arch, options, shape) in enumerate(CASES):
        channels = shape[-1]
        if arch.startswith("wrn-"):
            depth, widen = (int(v) for v in arch.split("-")[1:])
            net = wide_resnet(depth, widen, in_channels=channels)
        else:
            net = preact_resnet18(width=options.get("width", 64), in_channels=channels)
        weights = {k.split("/", 1)[1]: v for k, v in data.items() if k.startswith(f"{i}/")}
        copied = load_keras_weights(net, weights)
        net.eval()
        with torch.no_grad():
            x = torch.from_numpy(data[f"{i}/x"]).permute(0, 3, 1, 2).contiguous()
            logits = net(x).numpy()
        diff = float(np.max(np.abs(logits - data[f"{i}/logits"])))
        params = sum(p.numel() for p in net.parameters())
        print(f"{arch} {options} {shape}: {copied} tensors ported, {params:,} parameters, "
              f"max |logit diff| {diff:.2e}")
        worst = max(worst, diff)
    return worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("torch", "keras"), default="torch")
    parser.add_argument("--out", help="(--role keras) where to write the weights")
    parser.add_argument("--keras-python", default=os.path.join(".venv", "bin", "python"),
                        help="the project's Python (with TensorFlow), for the Keras side")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args(argv)
    if args.role == "keras":
        export_keras(args.out)
        return 0
    worst = compare(args.keras_python)
    print(f"largest difference {worst:.2e} (tolerance {args.tolerance:g}): "
          + ("same logits" if worst <= args.tolerance else "DIFFERENT"))
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
