"""Evaluate attack success on a plain digits CNN: a cascade of attacks, several budgets.

    .venv/bin/python examples/evaluate_attacks.py            # ~30 s on 2 cores
    .venv/bin/python examples/evaluate_attacks.py --quick    # a few seconds (the tests)

Guide: docs/guides/attack-evaluation.md.
"""
import argparse

import attacks
from attacks.reference import train_digits_cnn
from robustgrad.data import load_digits

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--quick", action="store_true", help="a tiny budget (used by the tests)")
parser.add_argument("--out", default=None, help="write report.json, report.txt and plots here")
args = parser.parse_args()

(x_train, y_train), (x_test, y_test) = data = load_digits()
model = train_digits_cnn(epochs=3 if args.quick else 15, seed=0, data=data)   # logits out
if args.quick:
    x_test, y_test = x_test[:64], y_test[:64]

report = attacks.evaluate(
    model, x_test, y_test,
    ["fgsm", "pgd", "square100"] if args.quick else ["fgsm", "pgd", "apgd-ce", "square"],
    eps=[0.05, 0.1], clip_min=0.0, clip_max=1.0)       # a cascade: later attacks see survivors
print(report)                                           # per attack and eps, then the worst case
for warning in report.warnings:                         # gradient-masking sanity checks
    print("warning:", warning)
if args.out:
    report.save(args.out)
