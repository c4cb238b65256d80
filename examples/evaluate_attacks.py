"""Evaluate attack success on a plain digits CNN: a cascade of attacks at two budgets.

    .venv/bin/python examples/evaluate_attacks.py            # the full run (27 s of CPU)
    .venv/bin/python examples/evaluate_attacks.py --quick    # the tests' tiny budget

Writes report.json, report.txt and plots under runs/evaluate_attacks/.
Guide: docs/guides/attack-evaluation.md.
"""
import sys

import attacks
from attacks.reference import train_digits_cnn
from robustgrad.data import load_digits

QUICK = "--quick" in sys.argv                   # the tests' tiny budget

(x_train, y_train), (x_test, y_test) = digits = load_digits()
model = train_digits_cnn(epochs=3 if QUICK else 15, seed=0, data=digits)   # logits out
if QUICK:
    x_test, y_test = x_test[:64], y_test[:64]

report = attacks.evaluate(
    model, x_test, y_test,
    ["fgsm", "pgd", "square100"] if QUICK else ["fgsm", "pgd", "apgd-ce", "square"],
    eps=[0.05, 0.1], clip_min=0.0, clip_max=1.0)       # a cascade: later attacks see survivors
print(report)                                           # per attack and eps, then the worst case
for warning in report.warnings:                         # gradient-masking sanity checks
    print("warning:", warning)
report.save("runs/evaluate_attacks")
