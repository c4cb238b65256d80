"""The PyTorch side of ``benchmarks/advtrain_scale.py``: Wong et al.'s fast adversarial training
("Fast is better than free", ICLR 2020) written plainly in PyTorch, on the same network as
``attacks.training.make_classifier`` (conv w, conv 2w, max-pool, conv 4w, max-pool, dense 4w,
dense C; 3x3 convolutions, "same" padding, ReLU).

It runs in a separate virtualenv holding CPU torch and numpy (never in the project's): the
benchmark starts it as a subprocess. The recipe: FGSM from a uniform start in the eps-ball,
step ``alpha`` (default 1.25 eps), the perturbation clipped to the ball and the image box;
Adam with the learning rate set before each batch from a schedule over the run (cyclic: 0 up
to ``lr_max`` at 2/5 of the run, then down to 0, as their MNIST code). Reads the benchmark's
``.npz`` (float32 NHWC in [0, 1]); writes the trained weights in Keras layout
(``w{i}``/``b{i}`` per layer) and the logits of the first 64 test images to an ``.npz`` (no
pickle), and prints one JSON line with the timings.
"""

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as nnf
from torch import nn


def _args():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--eps", type=float, default=0.1)
    p.add_argument("--alpha", type=float, default=None)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr-max", type=float, default=5e-3)
    p.add_argument("--schedule", default="cyclic", choices=("cyclic", "cosine", "flat"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--init", default=None, help="start from these Keras-layout weights")
    return p.parse_args()


class SmallCNN(nn.Module):
    """make_classifier's CNN; flattens in NHWC order so Keras weights port one to one."""

    def __init__(self, channels, side, width, classes):
        super().__init__()
        self.c1 = nn.Conv2d(channels, width, 3, padding=1)
        self.c2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.c3 = nn.Conv2d(2 * width, 4 * width, 3, padding=1)
        self.d1 = nn.Linear(4 * width * (side // 4) ** 2, 4 * width)
        self.d2 = nn.Linear(4 * width, classes)

    def forward(self, x):
        x = nnf.max_pool2d(nnf.relu(self.c2(nnf.relu(self.c1(x)))), 2)
        x = nnf.max_pool2d(nnf.relu(self.c3(x)), 2)
        x = x.permute(0, 2, 3, 1).flatten(1)
        return self.d2(nnf.relu(self.d1(x)))

    LAYERS = ("c1", "c2", "c3", "d1", "d2")

    def keras_weights(self):
        out = {}
        for i, name in enumerate(self.LAYERS):
            layer = getattr(self, name)
            w = layer.weight.detach().numpy()
            out[f"w{i}"] = w.transpose(2, 3, 1, 0) if w.ndim == 4 else w.T
            out[f"b{i}"] = layer.bias.detach().numpy()
        return out

    def load_keras_weights(self, arrays):
        with torch.no_grad():
            for i, name in enumerate(self.LAYERS):
                layer = getattr(self, name)
                w = arrays[f"w{i}"]
                layer.weight.copy_(torch.tensor(w.transpose(3, 2, 0, 1) if w.ndim == 4 else w.T))
                layer.bias.copy_(torch.tensor(arrays[f"b{i}"]))


def main():
    a = _args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    alpha = 1.25 * a.eps if a.alpha is None else a.alpha
    data = np.load(a.data)
    x_all = torch.tensor(data["x_train"]).permute(0, 3, 1, 2).contiguous()
    y_all = torch.tensor(data["y_train"]).long()
    classes = int(max(data["y_train"].max(), data["y_test"].max())) + 1
    net = SmallCNN(x_all.shape[1], x_all.shape[2], a.width, classes)
    if a.init:
        net.load_keras_weights(np.load(a.init))
    opt = torch.optim.Adam(net.parameters(), lr=a.lr_max)
    epochs = a.epochs

    def lr_at(t):  # t in epochs, fractional
        if a.schedule == "cyclic":
            return float(np.interp([t], [0, epochs * 2 / 5, epochs], [0, a.lr_max, 0])[0])
        if a.schedule == "cosine":
            return a.lr_max * (0.01 + 0.99 * 0.5 * (1 + np.cos(np.pi * t / epochs)))
        return a.lr_max

    n = len(x_all)
    batches = (n + a.batch - 1) // a.batch
    wall0, cpu0 = time.perf_counter(), time.process_time()
    history = []
    for epoch in range(epochs):
        order = torch.randperm(n)
        total_loss = total_correct = 0.0
        for i in range(batches):
            idx = order[i * a.batch:(i + 1) * a.batch]
            x, y = x_all[idx], y_all[idx]
            for group in opt.param_groups:
                group["lr"] = lr_at(epoch + (i + 1) / batches)
            delta = torch.zeros_like(x).uniform_(-a.eps, a.eps)
            delta.requires_grad = True
            nnf.cross_entropy(net(x + delta), y).backward()
            delta = torch.clamp(delta.detach() + alpha * delta.grad.sign(), -a.eps, a.eps)
            delta = torch.max(torch.min(1 - x, delta), -x)
            logits = net(torch.clamp(x + delta, 0, 1))
            loss = nnf.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total_loss += loss.item() * len(y)
            total_correct += (logits.argmax(1) == y).sum().item()
        history.append({"epoch": epoch + 1, "loss": total_loss / n,
                        "adv_accuracy": total_correct / n})
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    with torch.no_grad():
        x_test = torch.tensor(data["x_test"][:64]).permute(0, 3, 1, 2).contiguous()
        test_logits = net(x_test).numpy()
    np.savez(a.out, test_logits=test_logits, **net.keras_weights())
    print(json.dumps({"train_wall_s": wall, "train_cpu_s": cpu, "threads": a.threads,
                      "torch": torch.__version__, "history": history}), flush=True)


if __name__ == "__main__":
    main()
