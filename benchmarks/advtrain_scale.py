"""Robust classifiers at real scale (issue 26, section 4): our ``train-classifier`` defaults beside
a plain PyTorch implementation of the same recipe, on the same network, data, batch and epochs,
both judged by the same attacks on our side.

The data is the real 28x28 MNIST subset of ``../shared/data/mnist_digits10k.npz`` (8,000 training
and 2,000 test images of the official MNIST training set; see that file's README: it is not the
official split, so figures are not comparable with papers' full-MNIST tables). The project never
needs it; only this benchmark reads it.

``gap`` (the fast-AT gap of the issue): for each seed, interleaved,

* ours: ``robustgrad train-classifier --data <npz> --method fast --eps 0.1 --width 8
  --batch-size 64 --epochs 10`` with every other flag at its default (per-epoch validation and
  the catastrophic-overfitting guard included), in a subprocess;
* the reference: ``benchmarks/_torch_fast_at.py`` (Wong et al.'s fast-AT: FGSM from a random
  start, step 1.25 eps, Adam with a cyclic learning rate peaking at 5e-3) in a separate
  virtualenv with CPU torch (``--torch-python``, or one this script creates in
  ``--venv-dir`` with ``pip install torch==2.13.0+cpu numpy``), one thread as in the issue;
* both models judged on the 2,000 test images by ``attacks.evaluate`` (``--attacks``, default
  APGD-CE, plus AutoAttack when it is registered), the reference's weights ported into the same
  Keras network after checking the logits agree.

``recipe``: Wong et al.'s fast-MNIST recipe (``--recipe wong2020-fast-mnist``: eps 0.3, step
0.375, 10 epochs, batch 100, Adam cyclic 5e-3) through the CLI; clean, PGD-50 x 10 restarts and
APGD-CE (AutoAttack when registered) accuracy at eps 0.3, beside the paper's 98.50 / 88.77 /
82.93 on the full MNIST with their own network.

Times: the training wall time each side reports (ours: ``history.json``'s ``train_seconds``,
validation and guard included; the reference: its training loop), and the CPU seconds of each
whole process (``getrusage`` of the child: start-up, data, training and saving included).

Usage::

    python benchmarks/advtrain_scale.py gap --seeds 0 1 2
    python benchmarks/advtrain_scale.py recipe --seeds 0
    python benchmarks/advtrain_scale.py gap --torch-python /path/to/venv/bin/python

Writes ``--out``/advtrain_scale.json and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, _ROOT)  # this tree (a snapshot copy too), not the installed one

DEFAULT_DATA = os.path.join(_ROOT, "..", "shared", "data", "mnist_digits10k.npz")
TORCH_PIN = "torch==2.13.0+cpu"


def prepare_data(src: str, workdir: str) -> str:
    """The uint8 MNIST subset as float32 NHWC in [0, 1] (``.npz`` files keep their range)."""
    import numpy as np

    if not os.path.isfile(src):
        raise SystemExit(f"no data at {src}: this benchmark needs the MNIST subset of "
                         "../shared/data (see its README); pass --data")
    dst = os.path.join(workdir, "mnist_subset_float.npz")
    if not os.path.isfile(dst):
        raw = np.load(src)
        arrays = {k: (raw[k].astype(np.float32) / 255.0)[..., None] if k.startswith("x_")
                  else raw[k].astype(np.int64) for k in ("x_train", "y_train", "x_test", "y_test")}
        np.savez(dst, **arrays)
    return dst


def torch_python(args) -> str:
    """The interpreter of the reference's virtualenv (created on first use)."""
    if args.torch_python:
        return args.torch_python
    venv = os.path.abspath(args.venv_dir)
    py = os.path.join(venv, "bin", "python")
    if not os.path.isfile(py):
        print(f"creating the reference's virtualenv in {venv} ({TORCH_PIN}, numpy)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", TORCH_PIN, "numpy"], check=True)
    return py


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(cmd: list[str], env: dict | None = None) -> tuple[str, float, float]:
    """Run ``cmd``; returns (stdout, wall seconds, CPU seconds of the child)."""
    cpu0, t0 = _child_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall, cpu = time.perf_counter() - t0, _child_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc.stdout, wall, cpu


def _ours_env(threads: int) -> dict:
    env = dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if threads:
        env["TF_NUM_INTRAOP_THREADS"] = env["TF_NUM_INTEROP_THREADS"] = str(threads)
    return env


def train_ours(data: str, out: str, seed: int, flags: list[str], threads: int) -> dict:
    cmd = [sys.executable, "-c", "import sys; from robustgrad.cli import main; sys.exit(main())",
           "train-classifier", "--data", data, "--seed", str(seed), "--out", out, "--no-eval",
           "--verbose", "0", "--overwrite", *flags]
    _, wall, cpu = _run(cmd, _ours_env(threads))
    with open(os.path.join(out, "history.json")) as f:
        history = json.load(f)
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    return {"train_wall_s": history["train_seconds"], "process_wall_s": wall,
            "process_cpu_s": cpu, "model": os.path.join(out, "model.keras"),
            "settings": config["resolved"]["values"], "recipe": config["resolved"]["recipe"]}


def train_reference(py: str, data: str, out: str, seed: int, threads: int, **kw) -> dict:
    cmd = [py, os.path.join(_HERE, "_torch_fast_at.py"), "--data", data, "--out", out,
           "--seed", str(seed), "--threads", str(threads)]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    stdout, wall, cpu = _run(cmd, env)
    record = json.loads(stdout.strip().splitlines()[-1])
    return {"train_wall_s": record["train_wall_s"], "train_cpu_s": record["train_cpu_s"],
            "process_wall_s": wall, "process_cpu_s": cpu, "weights": out,
            "torch": record["torch"]}


def ported_model(weights: str, x_test):
    """The reference's weights in the Keras network; asserts the logits agree first."""
    import numpy as np

    from attacks.training import make_classifier

    arrays = np.load(weights)
    clf = make_classifier(x_test.shape[1:], arrays["b4"].shape[0], width=arrays["w0"].shape[-1])
    for i, layer in enumerate([layer for layer in clf.layers if layer.weights]):
        layer.set_weights([arrays[f"w{i}"], arrays[f"b{i}"]])
    ours = clf(x_test[:64], training=False).numpy()
    diff = float(np.abs(ours - arrays["test_logits"]).max())
    assert diff < 1e-3, f"ported logits differ from the reference's by {diff}"
    return clf, diff


def judge(model, x, y, eps: float, attack_list: list[str]) -> dict:
    import attacks

    out = {}
    for name in attack_list:
        t0 = time.perf_counter()
        report = attacks.evaluate(model, x, y, name, eps=eps, clip_min=0.0, clip_max=1.0,
                                  sanity_checks=False, n_examples=0)
        out[name] = {"robust_accuracy": float(report.worst_case[eps]),
                     "clean_accuracy": float(report.clean_accuracy),
                     "seconds": time.perf_counter() - t0}
    return out


def _attacks(requested: str | None) -> list[str]:
    import attacks

    if requested:
        return [a.strip() for a in requested.split(",") if a.strip()]
    names = ["apgd-ce"]
    if "autoattack" in getattr(attacks, "ATTACK_NAMES", ()):
        names.append("autoattack")
    return names


def gap(args, data: str, workdir: str) -> dict:
    import keras
    import numpy as np

    test = np.load(data)
    x, y = test["x_test"], test["y_test"]
    py = torch_python(args)
    attack_list = _attacks(args.attacks)
    flags = ["--method", "fast", "--eps", str(args.eps), "--width", str(args.width),
             "--batch-size", str(args.batch_size), "--epochs", str(args.epochs)]
    rows = []
    for seed in args.seeds:
        ours = train_ours(data, os.path.join(workdir, f"ours-seed{seed}"), seed, flags,
                          args.threads)
        ref = train_reference(py, data, os.path.join(workdir, f"ref-seed{seed}.npz"), seed,
                              args.ref_threads, width=args.width, eps=args.eps,
                              epochs=args.epochs, batch=args.batch_size)
        ref_model, port_diff = ported_model(ref["weights"], x)
        ours_model = keras.models.load_model(ours["model"])
        row = {"seed": seed, "ours": ours, "reference": ref, "port_max_abs_logit_diff": port_diff,
               "ours_eval": judge(ours_model, x, y, args.eps, attack_list),
               "reference_eval": judge(ref_model, x, y, args.eps, attack_list)}
        rows.append(row)
        _print_gap([row], attack_list)
    return {"rows": rows, "attacks": attack_list}


def _print_gap(rows, attack_list):
    print(f"{'seed':>4} {'side':>9} {'clean':>6} " + " ".join(f"{a:>11}" for a in attack_list)
          + f" {'train s':>8} {'proc CPU s':>10}")
    for r in rows:
        for side, ev in (("ours", "ours_eval"), ("reference", "reference_eval")):
            accs = " ".join(f"{r[ev][a]['robust_accuracy']:>11.4f}" for a in attack_list)
            clean = r[ev][attack_list[0]]["clean_accuracy"]
            print(f"{r['seed']:>4} {side:>9} {clean:>6.4f} {accs} "
                  f"{r[side]['train_wall_s']:>8.1f} {r[side]['process_cpu_s']:>10.1f}")
        o, f = r["ours"], r["reference"]
        print(f"     ratio ours/reference: train wall x{o['train_wall_s'] / f['train_wall_s']:.2f}, "
              f"process CPU x{o['process_cpu_s'] / f['process_cpu_s']:.2f}", flush=True)


def recipe(args, data: str, workdir: str) -> dict:
    import keras
    import numpy as np

    test = np.load(data)
    x, y = test["x_test"], test["y_test"]
    attack_list = ["pgd50x10", *_attacks(args.attacks)]
    rows = []
    for seed in args.seeds:
        ours = train_ours(data, os.path.join(workdir, f"recipe-seed{seed}"), seed,
                          ["--method", "fast", "--recipe", "wong2020-fast-mnist", "--width",
                           str(args.width)], args.threads)
        model = keras.models.load_model(ours["model"])
        ev = judge(model, x, y, ours["settings"]["eps"], attack_list)
        rows.append({"seed": seed, "ours": ours, "eval": ev})
        accs = ", ".join(f"{a} {ev[a]['robust_accuracy']:.4f}" for a in attack_list)
        print(f"seed {seed}: clean {ev[attack_list[0]]['clean_accuracy']:.4f}, {accs}; "
              f"train {ours['train_wall_s']:.0f} s, process CPU {ours['process_cpu_s']:.0f} s "
              f"(paper, full MNIST, their network: 98.50 / PGD-50x10 88.77 / AA 82.93)",
              flush=True)
    return {"rows": rows, "attacks": attack_list}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("gap", "recipe"))
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--eps", type=float, default=0.1)
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--attacks", default=None, help="comma-separated (default apgd-ce, "
                   "and autoattack when registered)")
    p.add_argument("--threads", type=int, default=1,
                   help="TensorFlow intra/inter-op threads of ours (0: TensorFlow's default)")
    p.add_argument("--ref-threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--torch-python", default=None)
    p.add_argument("--venv-dir", default=os.path.join(_ROOT, "runs", "venv-torch"))
    p.add_argument("--out", default=os.path.join(_ROOT, "runs", "advtrain_scale"))
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    data = prepare_data(os.path.abspath(args.data), args.out)
    result = gap(args, data, args.out) if args.what == "gap" else recipe(args, data, args.out)
    result.update({"what": args.what, "argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d"),
                   "load_average": os.getloadavg()})
    path = os.path.join(args.out, f"advtrain_scale_{args.what}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
