"""Randomized smoothing on digits: certified accuracy at L2 radii, Cohen et al.'s table layout.

Cohen, Rosenfeld & Kolter 2019 ("Certified Adversarial Robustness via Randomized Smoothing"):
the smoothed classifier ``g(x) = argmax_c P(f(x + N(0, sigma^2 I)) = c)`` with the certificate
of :func:`attacks.certify.smooth_certify` (``n0`` selection draws, ``n`` estimation draws,
Clopper-Pearson at ``alpha``, radius ``sigma * PhiInv(pA)``). For each ``sigma`` in ``--sigmas``
three base classifiers of the same architecture (the digits CNN of ``train-classifier``, arch
``cnn``, width ``--width``), trained ``--epochs`` epochs with Adam 1e-3, batch 64, are smoothed
with that ``sigma``:

* ``clean``: trained without noise (one model, smoothed at every sigma);
* ``gaussian``: Gaussian data augmentation with std ``sigma`` (Cohen et al.);
* ``smoothadv``: SmoothAdv_PGD (Salman et al. 2019) with ``sigma``, L2 radius ``eps = 2 sigma``
  (``--eps-ratio``), ``--steps`` PGD steps, ``--noise-draws`` draws, ``eps`` ramped over the
  first ``--warmup-epochs`` epochs (the defaults of ``recipes.json``).

The certified accuracy at radius ``r`` is the fraction of the first ``--n-examples`` digits test
images whose smoothed prediction is correct with a certified radius ``>= r`` (the column at
radius 0 is the smoothed classifier's accuracy where it does not abstain). Prints the training
and certification wall and CPU seconds of every row and the load average.

Usage (through the machine's long-job lock, from a snapshot of the committed tree)::

    python benchmarks/certify_smoothing.py            # n = 100,000 on 100 images: ~20 min
    python benchmarks/certify_smoothing.py --n 10000 --n-examples 200 --sigmas 0.25
                                                      # one sigma, n = 10,000: ~1 min

The largest radius ``n`` draws can certify is ``sigma * PhiInv(alpha ** (1 / n))``: 3.2 sigma at
``n = 10,000``, 3.8 sigma at 100,000 (``alpha = 0.001``), so radius 1.0 is out of reach at sigma
0.25 either way (as in Cohen et al.'s table).
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


def train(method, x, y, *, epochs, width, seed=0, **options):
    """A digits CNN trained by ``AdversarialTrainer(method, **options)``; ``(model, wall, cpu)``."""
    import keras

    from attacks import training

    keras.utils.set_random_seed(seed)
    t0, c0 = time.perf_counter(), time.process_time()
    model = training.make_classifier((8, 8), 10, width=width)
    tr = training.AdversarialTrainer(model, method=method, eval_steps=0, seed=seed, **options)
    tr.compile(optimizer=keras.optimizers.Adam(1e-3))
    tr.fit(x, y, batch_size=64, epochs=epochs, verbose=0)
    return model, time.perf_counter() - t0, time.process_time() - c0


def certified_accuracy(model, x, y, sigma, args):
    """Certified accuracy at each of :data:`RADII`, and the certification's wall/CPU seconds."""
    from attacks.certify import smooth_certify

    t0, c0 = time.perf_counter(), time.process_time()
    pred, radius = smooth_certify(model, x, sigma, n0=args.n0, n=args.n, alpha=args.alpha,
                                  seed=0, batch_size=args.batch_size)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ok = np.asarray(pred) == y
    return [float(np.mean(ok & (np.asarray(radius) >= r))) for r in RADII], wall, cpu


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sigmas", default="0.25,0.5,1.0")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--eps-ratio", type=float, default=2.0, help="smoothadv eps / sigma")
    parser.add_argument("--steps", type=int, default=2, help="smoothadv PGD steps")
    parser.add_argument("--noise-draws", type=int, default=2, help="smoothadv m")
    parser.add_argument("--warmup-epochs", type=int, default=10, help="smoothadv eps ramp")
    parser.add_argument("--n0", type=int, default=100)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--batch-size", type=int, default=1000, help="noisy inputs per pass")
    parser.add_argument("--n-examples", type=int, default=100)
    args = parser.parse_args(argv)

    from robustgrad.data import load_digits

    (x_train, y_train), (x_test, y_test) = load_digits()
    x, y = x_test[:args.n_examples], y_test[:args.n_examples]
    steps_per_epoch = -(-len(x_train) // 64)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
          f"{os.getloadavg()[0]:.1f}; digits: {len(x_train)} train, first {len(y)} test images; "
          f"n0 {args.n0}, n {args.n}, alpha {args.alpha}; cnn width {args.width}, "
          f"{args.epochs} epochs, Adam 1e-3, batch 64; smoothadv eps {args.eps_ratio:g} sigma, "
          f"{args.steps} steps, m {args.noise_draws}, warm-up {args.warmup_epochs} epochs",
          flush=True)
    print(f"{'model':<11}{'sigma':>6}" + "".join(f"{'r=' + str(r):>8}" for r in RADII)
          + f"{'train wall':>11}{'cpu':>7}{'certify wall':>13}{'cpu':>7}", flush=True)
    common = {"epochs": args.epochs, "width": args.width}
    clean = train("clean", x_train, y_train, eps=0.1, **common)
    for sigma in (float(s) for s in args.sigmas.split(",")):
        rows = {
            "clean": clean,
            "gaussian": train("gaussian", x_train, y_train, eps=sigma, **common),
            "smoothadv": train("smoothadv", x_train, y_train, eps=args.eps_ratio * sigma,
                               norm="l2", sigma=sigma, steps=args.steps,
                               noise_draws=args.noise_draws,
                               warmup_steps=args.warmup_epochs * steps_per_epoch, **common),
        }
        for name, (model, t_wall, t_cpu) in rows.items():
            acc, wall, cpu = certified_accuracy(model, x, y, sigma, args)
            print(f"{name:<11}{sigma:>6}" + "".join(f"{a:>8.3f}" for a in acc)
                  + f"{t_wall:>11.1f}{t_cpu:>7.1f}{wall:>13.1f}{cpu:>7.1f}", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
