"""A whole resumable adversarial-training run in a few lines: what `robustgrad train-classifier`
does, from Python (the command parses its flags into the same config and calls the same function).

    .venv/bin/python examples/resumable_classifier_run.py          # Ctrl-C, run again: it resumes
    .venv/bin/python examples/resumable_classifier_run.py --quick  # the tests' tiny budget

Writes runs/madry_digits/ (config.json with where each setting came from, checkpoints/,
history.json, model.keras, report.json). Guide: docs/guides/robust-classifiers.md.
"""
import sys

from attacks.training import ClassifierConfig, train_classifier
from robustgrad.rundir import RunDirectory

QUICK = "--quick" in sys.argv                   # the tests' tiny budget

config = ClassifierConfig(method="madry", eps=0.1, epochs=1 if QUICK else 10,
                          limit=512 if QUICK else None,     # unset: method defaults, recipe
                          eval_attacks="pgd20", eval_limit=200)
run = RunDirectory("runs/madry_digits")         # lock, config.json, checkpoints/, history.json
result = train_classifier(config, run, resume=run.has_config(), verbose=0 if QUICK else 1)

print(f"lr {result.config.lr} ({result.config.origin['lr']}), epochs {result.config.epochs}, "
      f"trained {result.train_seconds:.0f} s in all")
print(f"clean accuracy {result.report['clean_accuracy']:.3f}, "
      f"PGD-20 accuracy at L-inf eps 0.1: {result.report['worst_case']['0.1']:.3f}")
