"""The attacks stage of ``robustgrad demo``: train the plain digits CNN of
:mod:`attacks.reference` briefly, evaluate its robustness with a cascade of attacks and write the
report under ``out_dir/attacks`` (``report.json``, ``report.txt``, ``robust_accuracy.png``,
``examples.png``, ``digits_cnn.keras``).

Example (about 20 s on 2 cores)::

    from robustgrad.commands import _demo_attacks
    report = _demo_attacks.run("runs/demo")
"""

from __future__ import annotations

import os
import time

ATTACKS = ("fgsm", "pgd", "apgd-ce", "square")
EPS = (0.05, 0.1, 0.2)
EPOCHS = 15


def run(out_dir: str = "runs/demo"):
    """Train, evaluate (:data:`ATTACKS` at L-inf :data:`EPS`), write the report; returns the
    :class:`attacks.EvaluationReport`."""
    import attacks
    from attacks.reference import train_digits_cnn
    from robustgrad.data import load_digits

    t0 = time.perf_counter()
    out = os.path.join(os.fspath(out_dir), "attacks")
    os.makedirs(out, exist_ok=True)
    data = load_digits()
    (_, _), (x_test, y_test) = data
    print(f"[attacks] training a plain CNN on digits ({EPOCHS} epochs) ...", flush=True)
    model = train_digits_cnn(epochs=EPOCHS, data=data)
    model_path = os.path.join(out, "digits_cnn.keras")
    model.save(model_path)
    eps_text = ", ".join(f"{e:g}" for e in EPS)
    print(f"[attacks] saved the model to {model_path}; evaluating on {len(x_test)} test images "
          f"with {', '.join(ATTACKS)} (cascade) at L∞ eps {eps_text} ...", flush=True)
    report = attacks.evaluate(model, x_test, y_test, list(ATTACKS), list(EPS), batch_size=512,
                              clip_min=0.0, clip_max=1.0)
    paths = report.save(out)
    print(report.table())
    print(f"[attacks] wrote {', '.join(paths.values())} ({time.perf_counter() - t0:.0f} s)")
    print(f"[attacks] re-run from the command line: robustgrad evaluate --model {model_path} "
          f"--data digits --attacks {','.join(ATTACKS)} --eps {','.join(f'{e:g}' for e in EPS)} "
          f"--out {out} --overwrite")
    return report
