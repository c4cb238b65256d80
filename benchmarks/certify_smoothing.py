"""Randomized smoothing on digits: certified accuracy at L2 radii of Gaussian-noise-trained CNNs.

Cohen, Rosenfeld & Kolter 2019 ("Certified Adversarial Robustness via Randomized Smoothing"):
the smoothed classifier ``g(x) = argmax_c P(f(x + N(0, sigma^2 I)) = c)`` with the certificate
of :func:`attacks.certify.smooth_certify` (``n0`` selection draws, ``n`` estimation draws,
Clopper-Pearson at ``alpha``, radius ``sigma * PhiInv(pA)``). For each ``sigma`` in ``--sigmas``
the digits CNN of ``train-classifier`` (arch ``cnn``, width ``--width``) is trained with
``--method gaussian --eps sigma`` (noise of that standard deviation) for ``--epochs`` epochs, and
for reference a clean-trained one of the same architecture is smoothed with the same ``sigma``.
The certified accuracy at radius ``r`` is the fraction of the ``--n-examples`` digits test images
whose smoothed prediction is correct with a certified radius ``>= r`` (the clean accuracy of
``g`` is the column at radius 0). Prints wall and CPU seconds of each certification.

Usage::

    python benchmarks/certify_smoothing.py                 # ~5 min on 2 cores
    python benchmarks/certify_smoothing.py --n 1000        # quick
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[0:1] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import numpy as np  # noqa: E402

RADII = (0.0, 0.25, 0.5, 1.0)


def train(method, sigma, epochs, width, x, y, seed=0):
    import keras

    from attacks import training

    keras.utils.set_random_seed(seed)
    model = training.make_classifier((8, 8), 10, width=width)
    tr = training.AdversarialTrainer(model, method=method, eps=sigma, eval_steps=0)
    tr.compile(optimizer=keras.optimizers.Adam(1e-3))
    tr.fit(x, y, batch_size=64, epochs=epochs, verbose=0)
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sigmas", default="0.25,0.5")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--n0", type=int, default=100)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--n-examples", type=int, default=450)
    args = parser.parse_args(argv)

    from attacks.certify import smooth_certify
    from robustgrad.data import load_digits

    (x_train, y_train), (x_test, y_test) = load_digits()
    x, y = x_test[:args.n_examples], y_test[:args.n_examples]
    print(f"digits test: {len(y)} images; n0 {args.n0}, n {args.n}, alpha {args.alpha}; "
          f"train {args.epochs} epochs, cnn width {args.width}")
    print(f"{'model':<26}{'sigma':>6}" + "".join(f"{'r=' + str(r):>9}" for r in RADII)
          + f"{'wall s':>9}{'cpu s':>8}")
    models = {"clean": train("clean", 0.1, args.epochs, args.width, x_train, y_train)}
    for sigma in (float(s) for s in args.sigmas.split(",")):
        models[f"gaussian {sigma}"] = train("gaussian", sigma, args.epochs, args.width, x_train,
                                            y_train)
        for name in ("clean", f"gaussian {sigma}"):
            t0, c0 = time.perf_counter(), time.process_time()
            pred, radius = smooth_certify(models[name], x, sigma, n0=args.n0, n=args.n,
                                          alpha=args.alpha, seed=0)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            ok = np.asarray(pred) == y
            acc = [float(np.mean(ok & (np.asarray(radius) >= r))) for r in RADII]
            print(f"{name:<26}{sigma:>6}" + "".join(f"{a:>9.3f}" for a in acc)
                  + f"{wall:>9.1f}{cpu:>8.1f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
