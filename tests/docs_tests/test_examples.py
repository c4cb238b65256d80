"""Every script in examples/ runs (with its --quick budget) and prints a result that makes sense.

Each example is what a guide and the README show (the README's code lines are checked against
these files in tests/docs_tests/test_docs.py). The full budgets are for people; the tests use ``--quick``.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name: str, cwd: Path) -> str:
    """Run ``examples/name --quick`` in ``cwd`` (where it writes its files); its stdout."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MPLBACKEND="Agg",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), "--quick"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


def number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in the output:\n{text}"
    return float(match.group(1))


def test_every_example_is_tested_here():
    tested = set(re.findall(r'run_example\("([a-z_]+\.py)"', Path(__file__).read_text()))
    assert tested == {p.name for p in EXAMPLES.glob("*.py")}


def test_train_robust_classifier(tmp_path):
    out = run_example("train_robust_classifier.py", tmp_path)
    clean = number(r"clean accuracy ([0-9.]+)", out)
    robust = number(r"PGD-20 accuracy at L-inf eps 0.1: ([0-9.]+)", out)
    assert clean > 0.5 and 0.0 <= robust <= clean   # 2 epochs: learning, and PGD can only lower it
    assert (tmp_path / "robust_digits.keras").is_file()


def test_evaluate_attacks(tmp_path):
    out = run_example("evaluate_attacks.py", tmp_path)
    worst = [float(v) for v in re.findall(r"WORST CASE\s+([0-9.]+)", out)]
    assert len(worst) == 2 and worst[1] <= worst[0] < 1.0   # eps 0.05 then 0.1: never rises
    assert (tmp_path / "runs/evaluate_attacks/report.json").is_file()


def test_train_agent(tmp_path):
    out = run_example("train_agent.py", tmp_path)
    assert number(r"mean return over 10 episodes: ([0-9.]+)", out) > 40   # random policy: ~22
    assert "reloaded: True" in out


def test_attack_agent(tmp_path):
    out = run_example("attack_agent.py", tmp_path)
    clean = number(r"clean return ([0-9.]+);", out)
    worst = number(r"at eps 0.2: ([0-9.]+)", out)
    assert worst < clean   # the strongest of three attacks at eps 0.2 lowers the return
    assert (tmp_path / "runs/attack_agent/report.json").is_file()


def test_resumable_classifier_run(tmp_path):
    """The README's whole run (its resume is the doctest of attacks.training.run, in-process)."""
    out = run_example("resumable_classifier_run.py", tmp_path)
    assert "lr 0.001 (default), epochs 1" in out   # unset: the method's default, said
    clean = number(r"clean accuracy ([0-9.]+)", out)
    robust = number(r"PGD-20 accuracy at L-inf eps 0.1: ([0-9.]+)", out)
    assert 0.0 <= robust <= clean   # 1 epoch on 512 images: PGD can only lower it
    run = tmp_path / "runs/madry_digits"
    assert json.loads((run / "config.json").read_text())["resolved"]["origin"]["lr"] == "default"
    assert (run / "model.keras").is_file() and (run / "checkpoints").is_dir()
