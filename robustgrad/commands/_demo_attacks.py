"""The attacks stage of ``robustgrad demo``: train the plain digits CNN of
:mod:`attacks.reference` briefly, evaluate its robustness with a cascade of attacks and write the
report under ``out_dir/attacks`` (``report.json``, ``report.txt``, ``robust_accuracy.png``,
``examples.png``, ``digits_cnn.keras``); then train the same CNN adversarially
(:class:`attacks.AdversarialTrainer`, ``fast`` FGSM training at eps :data:`ROBUST_EPS`,
:data:`ROBUST_EPOCHS` epochs), evaluate it under the same attacks (``out_dir/attacks/robust``)
and print both side by side.

Example (about a minute on 2 cores)::

    from robustgrad.commands import _demo_attacks
    report = _demo_attacks.run("runs/demo")
"""

from __future__ import annotations

import os
import time

ATTACKS = ("fgsm", "pgd", "apgd-ce", "square")
EPS = (0.05, 0.1, 0.2)
EPOCHS = 15
ROBUST_EPS = 0.1
ROBUST_EPOCHS = 15


def run(out_dir: str | os.PathLike[str] = "runs/demo"):
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
    print(f"[attacks] wrote {', '.join(map(str, paths.values()))} ({time.perf_counter() - t0:.0f} s)")
    print(f"[attacks] re-run from the command line: robustgrad evaluate --model {model_path} "
          f"--data digits --attacks {','.join(ATTACKS)} --eps {','.join(f'{e:g}' for e in EPS)} "
          f"--out {out} --overwrite")
    return report


def run_robust(out_dir: str | os.PathLike[str] = "runs/demo", plain_report=None) -> dict:
    """Train the digits CNN adversarially (``fast``), evaluate it like the plain one, print the
    comparison; returns ``{"eps": [...], "plain": [...], "robust": [...]}`` (worst-case robust
    accuracy per eps, clean accuracy first at eps 0)."""
    import keras

    import attacks
    from attacks.reference import digits_cnn
    from robustgrad.data import load_digits

    t0 = time.perf_counter()
    out = os.path.join(os.fspath(out_dir), "attacks", "robust")
    os.makedirs(out, exist_ok=True)
    (x_train, y_train), (x_test, y_test) = load_digits()
    print(f"[attacks] training the same CNN adversarially (fast FGSM training, eps "
          f"{ROBUST_EPS:g}, {ROBUST_EPOCHS} epochs) ...", flush=True)
    keras.utils.set_random_seed(0)
    clf = digits_cnn(0)
    trainer = attacks.AdversarialTrainer(clf, method="fast", eps=ROBUST_EPS, clip_min=0.0,
                                         clip_max=1.0)
    trainer.compile(optimizer=keras.optimizers.Adam(3e-3))
    trainer.fit(x_train, y_train, batch_size=64, epochs=ROBUST_EPOCHS, verbose=0)
    clf.save(os.path.join(out, "digits_cnn_fast.keras"))
    report = attacks.evaluate(clf, x_test, y_test, list(ATTACKS), list(EPS), batch_size=512,
                              clip_min=0.0, clip_max=1.0)
    report.save(out)
    curves = {"eps": [0.0, *EPS], "robust": [report.clean_accuracy,
                                             *(report.worst_case[e] for e in EPS)]}
    if plain_report is not None:
        curves["plain"] = [plain_report.clean_accuracy,
                           *(plain_report.worst_case[e] for e in EPS)]
        print(f"[attacks] worst-case robust accuracy over {', '.join(ATTACKS)} "
              f"({len(x_test)} test images, L∞):")
        print(f"  {'eps':>5s}  {'plain':>7s}  {'fast-AT':>7s}")
        for e, a, b in zip(curves["eps"], curves["plain"], curves["robust"]):
            print(f"  {e:5g}  {a:7.3f}  {b:7.3f}" + ("   (clean)" if e == 0 else ""))
    print(f"[attacks] wrote the adversarially trained model's report to {out} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return curves
