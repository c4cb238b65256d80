"""Adversarial-training throughput and memory at CIFAR scale (issue 26, section 4): one PGD-10
training step of PreActResNet-18 on 32x32x3 batches, ours beside the clean step of the same
model and beside the same step written plainly in PyTorch on the same ported weights; and the
peak memory of one PGD-10 step of WRN-28-10 at batch 128.

``throughput``: long-lived worker processes, one per side, each built once, warmed up, then
driven in rounds (one side at a time, so they never compete for the cores):

* ``ours`` (``ours-xla`` with ``--xla``): ``attacks.training.AdversarialTrainer(method="madry",
  eps=8/255, steps=10, step_size=2/255, weight_decay=5e-4)`` on
  ``make_model("preactresnet18", width=...)`` with SGD 0.1 momentum 0.9, stepped through the
  function Keras' ``fit`` runs (``trainer.make_train_function()``, ``jit_compile`` off, or on
  for ``ours-xla``); the clean step is the same trainer with ``method="clean"``;
* ``ours-direct`` (``--direct-too``): ours with ``convolutions="direct"`` (TensorFlow's
  convolutions; ``ours`` runs the library's default, ``"auto"``: Winograd on a host without a
  GPU, ``--convolutions`` to choose);
* ``ours-fusedbn`` (``--fused-bn``, an experiment): ours with the model instance's Keras
  ``BatchNormalization`` layers computing with TensorFlow's fused kernel (same semantics);
* ``torch``: the same network (``benchmarks/torch_architectures.py``, the Keras weights ported,
  logits checked to agree before timing) and the same step written plainly: PGD-10 on the
  cross-entropy from a uniform start with the model in eval mode (input gradient only,
  ``torch.autograd.grad``), then one SGD step (momentum 0.9, coupled weight decay 5e-4) on the
  adversarial batch in train mode; its clean step beside it. It runs in a separate virtualenv
  with CPU torch (``--torch-python``).

Both sides get the same random batches (uniform pixels, random labels: throughput does not
depend on the data) and the same thread count (TensorFlow intra-op ``--threads``, inter-op
``--inter-threads``; ``torch.set_num_threads(--threads)``). Each step is timed to completion
(wall: ``perf_counter``; CPU: ``process_time`` of the worker, every thread). Reported: the
median over the timed rounds (after ``--warmup`` untimed steps per side), the spread over
rounds, images per second, and the ratios the issue sets goals for:

    adversarial step <= 1.15 x (k + 1) clean steps (k = 10);   ours <= 1.0 x torch

``memory``: for each side a fresh process builds WRN-28-10 (``--mem-arch``), notes its peak
resident set (``getrusage(RUSAGE_SELF).ru_maxrss``) as the baseline, runs ONE PGD-10 training
step at ``--mem-batch`` (128) and reports the new peak and the difference. With
``--mem-repeats N`` it runs N steps in that process and reports each one's wall and CPU time
(ours' first includes its tracing and graph optimisation, the later ones are steady) and the
peak over all; the one-line summary and the ratios stay the first step's.

Ours runs on TensorFlow's own choice of kernels (``--onednn tf``, the default: oneDNN only on
CPUs with AVX-512 VNNI/BF16 or AMX); ``--onednn on`` / ``off`` force ``TF_ENABLE_ONEDNN_OPTS``.
Both workers report whether oneDNN ran.

Usage (from the repository root)::

    python benchmarks/advtrain_throughput.py throughput --torch-python /path/to/venv/bin/python
    python benchmarks/advtrain_throughput.py throughput --width 16 --rounds 2 --batch 16  # quick
    python benchmarks/advtrain_throughput.py memory --torch-python /path/to/venv/bin/python
    python benchmarks/advtrain_throughput.py all --torch-python ... --xla

Writes ``--out``/advtrain_throughput.json and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)

EPS, STEP, K = 8 / 255, 2 / 255, 10
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 5e-4
_TAG = "@@"  # the workers' protocol lines on stdout start with this


# ----------------------------------------------------------------------------------- helpers

def _emit(obj) -> None:
    sys.__stdout__.write(_TAG + json.dumps(obj) + "\n")
    sys.__stdout__.flush()


def _batches(n: int, batch: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [(rng.random((batch, 32, 32, 3), dtype=np.float32),
             rng.integers(0, 10, size=batch).astype(np.int64)) for _ in range(n)]


def _serve(steps: dict) -> None:
    """The worker loop: read ``{"kind", "n"}`` lines, time ``n`` steps of ``steps[kind]``."""
    import itertools

    counter = itertools.count()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        walls, cpus = [], []
        for _ in range(int(cmd["n"])):
            i = next(counter)
            c0, t0 = time.process_time(), time.perf_counter()
            steps[cmd["kind"]](i)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        _emit({"wall": walls, "cpu": cpus})


def _tf_threads(threads: int, inter: int) -> None:
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    if inter:
        tf.config.threading.set_inter_op_parallelism_threads(inter)


def _ours_model(arch: str, width: int, seed: int = 0):
    import keras

    from attacks.training import CIFAR10_MEAN, CIFAR10_STD, make_model

    keras.utils.set_random_seed(seed)
    options = {"width": width} if arch == "preactresnet18" else {}
    return make_model(arch, (32, 32, 3), 10, mean=CIFAR10_MEAN, std=CIFAR10_STD, **options)


def _ours_trainer(clf, method: str, jit: bool, steps: int = K,
                  recompute: str = "activations", convolutions: str = "auto"):
    from attacks.training import AdversarialTrainer, make_optimizer

    crafting = {} if method == "clean" else {"steps": steps, "step_size": STEP}
    tr = AdversarialTrainer(clf, method=method, eps=EPS, weight_decay=WEIGHT_DECAY,
                            recompute=recompute, convolutions=convolutions, **crafting)
    tr.compile(optimizer=make_optimizer("sgd", LR, momentum=MOMENTUM), jit_compile=jit)
    tr._maybe_build_grad_step()  # what fit() does first
    tr.make_train_function()
    return tr


def _fuse_batchnorm(model):
    """EXPERIMENT (``--fused-bn``, not in the library): this instance's Keras
    ``BatchNormalization`` layers compute with TensorFlow's fused kernel, with Keras' semantics
    (moving variance from the biased batch variance). The saved model is unchanged."""
    import keras
    import tensorflow as tf

    for layer in model.layers:
        if not isinstance(layer, keras.layers.BatchNormalization):
            continue

        def call(inputs, training=None, mask=None, layer=layer):
            gamma, beta = layer.gamma.value, layer.beta.value
            if training:
                y, mean, var = tf.compat.v1.nn.fused_batch_norm(
                    inputs, gamma, beta, epsilon=layer.epsilon, is_training=True)
                n = tf.cast(tf.reduce_prod(tf.shape(inputs)[:-1]), var.dtype)
                var = var * (n - 1.0) / n  # the kernel returns the Bessel-corrected variance
                m = layer.momentum
                layer.moving_mean.assign(layer.moving_mean * m + mean * (1.0 - m))
                layer.moving_variance.assign(layer.moving_variance * m + var * (1.0 - m))
                return y
            y, _, _ = tf.compat.v1.nn.fused_batch_norm(
                inputs, gamma, beta, mean=layer.moving_mean.value,
                variance=layer.moving_variance.value, epsilon=layer.epsilon, is_training=False)
            return y

        layer.call = call
    return model


def _ours_step_fn(tr, batches):
    """One call of the function ``fit`` runs per step, on batch ``i % len(batches)``; waits
    for the result."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(
        (tf.stack([b[0] for b in batches]), tf.stack([b[1] for b in batches]))).repeat()
    it = iter(ds)
    fn = tr.train_function

    def step(_i):
        out = fn(it)
        logs = out.get_value() if hasattr(out, "get_value") else out
        float(logs["loss"])

    return step


# ----------------------------------------------------------------------------------- workers

def worker_ours(args) -> None:
    sys.stdout = sys.stderr
    sys.path.insert(0, _ROOT)
    import numpy as np

    _tf_threads(args.threads, args.inter_threads)
    import tensorflow as tf

    t0 = time.perf_counter()
    clf = _ours_model("preactresnet18", args.width)
    batches = _batches(args.pool, args.batch)
    clf(batches[0][0][:4], training=True)  # batch-norm statistics off their initial values
    if args.export:
        arrays = {f"{layer.name}/{w.name}": np.asarray(w.numpy())
                  for layer in clf.layers for w in layer.weights}
        arrays["x"] = batches[0][0][:8]
        arrays["logits"] = clf(batches[0][0][:8], training=False).numpy()
        np.savez(args.export, **arrays)
    # two trainers on two copies of the same network, so the clean and the adversarial steps
    # do not move each other's weights
    clean_clf = _ours_model("preactresnet18", args.width)
    clean_clf.set_weights(clf.get_weights())
    if args.fused_bn:
        _fuse_batchnorm(clf)
        _fuse_batchnorm(clean_clf)
    adv = _ours_trainer(clf, "madry", args.jit, convolutions=args.convolutions)
    clean = _ours_trainer(clean_clf, "clean", args.jit, convolutions=args.convolutions)
    steps = {"adv": _ours_step_fn(adv, batches), "clean": _ours_step_fn(clean, batches)}
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    for kind in ("clean", "adv"):
        steps[kind](0)  # tracing (and XLA compiling)
    _emit({"ready": True, "build_s": build, "first_steps_s": time.perf_counter() - t0,
           "tensorflow": tf.__version__, "jit_compile": bool(args.jit),
           "fused_batchnorm_experiment": bool(args.fused_bn),
           "convolutions": adv.convolutions, "winograd_tile": adv.winograd_tile(),
           "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
           "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
           "onednn": _onednn_enabled()})
    _serve(steps)


def _torch_arch():
    import importlib.util

    spec = importlib.util.spec_from_file_location("torch_architectures",
                                                  os.path.join(_HERE, "torch_architectures.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _torch_pgd_step(torch, net, opt, x, y, steps=K):
    """The plain PGD-k training step: craft in eval mode (input gradient only), update in
    train mode."""
    cross_entropy = torch.nn.functional.cross_entropy

    net.eval()
    x_adv = (x + torch.empty_like(x).uniform_(-EPS, EPS)).clamp_(0.0, 1.0)
    for _ in range(steps):
        x_adv.requires_grad_(True)
        loss = cross_entropy(net(x_adv), y)
        (g,) = torch.autograd.grad(loss, x_adv)
        x_adv = torch.min(torch.max(x_adv.detach() + STEP * g.sign(), x - EPS), x + EPS)
        x_adv = x_adv.clamp_(0.0, 1.0)
    net.train()
    opt.zero_grad(set_to_none=True)
    loss = cross_entropy(net(x_adv), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


def _torch_clean_step(torch, net, opt, x, y):
    cross_entropy = torch.nn.functional.cross_entropy

    net.train()
    opt.zero_grad(set_to_none=True)
    loss = cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


def worker_torch(args) -> None:
    sys.stdout = sys.stderr
    import copy

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    if args.inter_threads:
        torch.set_num_interop_threads(args.inter_threads)
    torch.manual_seed(0)
    arch = _torch_arch()
    t0 = time.perf_counter()
    data = dict(np.load(args.weights))
    net = arch.preact_resnet18(width=args.width)
    arch.load_keras_weights(net, data)
    net.eval()
    with torch.no_grad():
        logits = net(torch.from_numpy(data["x"]).permute(0, 3, 1, 2).contiguous()).numpy()
    diff = float(np.abs(logits - data["logits"]).max())
    if diff > 1e-3:
        raise SystemExit(f"ported logits differ from the Keras model's by {diff}")
    clean_net = copy.deepcopy(net)
    nets = {"adv": net, "clean": clean_net}
    opts = {k: torch.optim.SGD(n.parameters(), lr=LR, momentum=MOMENTUM,
                               weight_decay=WEIGHT_DECAY) for k, n in nets.items()}
    batches = [(torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(y))
               for x, y in _batches(args.pool, args.batch)]

    def make(kind):
        fn = _torch_pgd_step if kind == "adv" else _torch_clean_step

        def step(i):
            x, y = batches[i % len(batches)]
            fn(torch, nets[kind], opts[kind], x, y)

        return step

    steps = {k: make(k) for k in nets}
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    for kind in ("clean", "adv"):
        steps[kind](0)
    _emit({"ready": True, "build_s": build, "first_steps_s": time.perf_counter() - t0,
           "torch": torch.__version__, "port_max_abs_logit_diff": diff,
           "intra_op_threads": torch.get_num_threads(),
           "inter_op_threads": torch.get_num_interop_threads(),
           "mkldnn": bool(torch.backends.mkldnn.is_available())})
    _serve(steps)


def _maxrss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _cpu_split() -> tuple[float, float, int]:
    """User and system CPU seconds of this process, and its minor page faults."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_minflt


def _timed_steps(step, repeats: int) -> dict:
    """Run ``step()`` ``repeats`` times, each timed to completion. The ``step_*`` fields are
    the first step's (ours: with its tracing and graph optimisation); ``steps`` lists every
    step's wall, CPU (user, system), page faults and the peak resident set after it;
    ``peak_mib`` is the peak over all of them."""
    steps = []
    for _ in range(repeats):
        u0, s0, f0 = _cpu_split()
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        u1, s1, f1 = _cpu_split()
        steps.append({"wall_s": wall, "cpu_s": cpu, "user_s": u1 - u0, "sys_s": s1 - s0,
                      "minor_faults": f1 - f0, "peak_mib": _maxrss_mib()})
    first = steps[0]
    return {"peak_mib": _maxrss_mib(), "step_wall_s": first["wall_s"],
            "step_cpu_s": first["cpu_s"], "step_user_s": first["user_s"],
            "step_sys_s": first["sys_s"], "step_minor_faults": first["minor_faults"],
            "steps": steps}


def worker_memory_ours(args) -> None:
    sys.stdout = sys.stderr
    sys.path.insert(0, _ROOT)
    from robustgrad.memory import return_large_blocks, reuse_freed_memory

    reused = reuse_freed_memory() if args.reuse_freed_memory else False  # before TensorFlow
    _tf_threads(args.threads, args.inter_threads)
    import tensorflow as tf

    if args.malloc_threshold:
        return_large_blocks(args.malloc_threshold)
    (x, y), = _batches(1, args.mem_batch)
    clf = _ours_model(args.mem_arch, 0)
    tr = _ours_trainer(clf, "madry", args.jit, steps=args.mem_steps, recompute=args.recompute,
                       convolutions=args.convolutions)
    params = int(sum(int(tf.size(v)) for v in clf.trainable_variables))
    base = _maxrss_mib()
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    it = iter(ds)

    def step() -> None:
        out = tr.train_function(it)
        logs = out.get_value() if hasattr(out, "get_value") else out
        float(logs["loss"])

    _emit({"side": "ours", "baseline_mib": base, **_timed_steps(step, args.mem_repeats),
           "params": params, "tensorflow": tf.__version__, "recompute": tr.recompute,
           "convolutions": tr.convolutions, "winograd_tile": tr.winograd_tile(),
           "malloc_threshold": args.malloc_threshold, "reuse_freed_memory": reused,
           "onednn": _onednn_enabled()})


def worker_memory_torch(args) -> None:
    sys.stdout = sys.stderr
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    arch = _torch_arch()
    depth, widen = (int(v) for v in args.mem_arch.split("-")[1:])
    net = arch.wide_resnet(depth, widen)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    (x, y), = _batches(1, args.mem_batch)
    x = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    y = torch.from_numpy(y)
    params = int(sum(p.numel() for p in net.parameters()))
    base = _maxrss_mib()

    def step() -> None:
        _torch_pgd_step(torch, net, opt, x, y, steps=args.mem_steps)

    _emit({"side": "torch", "baseline_mib": base, **_timed_steps(step, args.mem_repeats),
           "params": params, "torch": torch.__version__})


# ----------------------------------------------------------------------------------- driver

class Worker:
    """A worker subprocess spoken to in JSON lines."""

    def __init__(self, name: str, cmd: list[str], env: dict):
        self.name = name
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.info = self.read()

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(_TAG):
                return json.loads(line[len(_TAG):])
        raise SystemExit(f"worker {self.name} exited ({self.proc.wait()}) without answering")

    def time(self, kind: str, n: int) -> dict:
        self.proc.stdin.write(json.dumps({"kind": kind, "n": n}) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


def _env(args) -> dict:
    env = dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["OMP_NUM_THREADS"] = str(args.threads)
    if args.onednn != "tf":  # ours: TF_ENABLE_ONEDNN_OPTS forced on or off
        env["TF_ENABLE_ONEDNN_OPTS"] = "1" if args.onednn == "on" else "0"
    return env


def _onednn_enabled() -> bool:
    """Whether this process's TensorFlow runs oneDNN's kernels (its own check; private API)."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def _common(args) -> list[str]:
    return ["--threads", str(args.threads), "--inter-threads", str(args.inter_threads),
            "--batch", str(args.batch), "--width", str(args.width), "--pool", str(args.pool)]


def _summary(walls: list[float], cpus: list[float], batch: int) -> dict:
    med = statistics.median(walls)
    return {"wall_s": med, "cpu_s": statistics.median(cpus), "min_wall_s": min(walls),
            "max_wall_s": max(walls), "spread": (max(walls) - min(walls)) / med,
            "images_per_s": batch / med, "rounds_wall_s": walls, "rounds_cpu_s": cpus}


def throughput(args) -> dict:
    script = os.path.abspath(__file__)
    export = os.path.join(os.path.abspath(args.out), "throughput_weights.npz")
    env = _env(args)
    sides = {}
    try:
        sides["ours"] = Worker("ours", [sys.executable, script, "worker-ours", "--export", export,
                                        "--convolutions", args.convolutions, *_common(args)],
                               env)
        if args.direct_too:
            sides["ours-direct"] = Worker("ours-direct", [
                sys.executable, script, "worker-ours", "--convolutions", "direct",
                *_common(args)], env)
        if args.xla:
            sides["ours-xla"] = Worker("ours-xla", [sys.executable, script, "worker-ours",
                                                    "--jit", *_common(args)], env)
        if args.fused_bn:
            sides["ours-fusedbn"] = Worker("ours-fusedbn", [sys.executable, script, "worker-ours",
                                                            "--fused-bn", *_common(args)], env)
        if args.torch_python:
            sides["torch"] = Worker("torch", [args.torch_python, script, "worker-torch",
                                              "--weights", export, *_common(args)], env)
        for name, w in sides.items():
            print(f"{name}: ready {json.dumps(w.info)}", flush=True)
        for w in sides.values():  # warm-up beyond the tracing step
            for kind in ("clean", "adv"):
                w.time(kind, args.warmup)
        raw = {name: {"clean": ([], []), "adv": ([], [])} for name in sides}
        for r in range(args.rounds):
            line = []
            for name, w in sides.items():
                for kind, n in (("clean", args.clean_steps), ("adv", 1)):
                    res = w.time(kind, n)
                    raw[name][kind][0].append(sum(res["wall"]) / n)
                    raw[name][kind][1].append(sum(res["cpu"]) / n)
                    line.append(f"{name} {kind} {raw[name][kind][0][-1]:.2f}s")
            print(f"round {r + 1}/{args.rounds} (load {os.getloadavg()[0]:.2f}): "
                  + ", ".join(line), flush=True)
    finally:
        for w in sides.values():
            w.close()
    result = {"sides": {}, "k": K, "eps": EPS, "step_size": STEP, "batch": args.batch,
              "width": args.width, "threads": args.threads, "inter_threads": args.inter_threads,
              "rounds": args.rounds, "warmup": args.warmup, "clean_steps": args.clean_steps}
    for name, w in sides.items():
        result["sides"][name] = {"info": w.info,
                                 **{kind: _summary(*raw[name][kind], args.batch)
                                    for kind in ("clean", "adv")}}
        s = result["sides"][name]
        s["adv_over_clean"] = s["adv"]["wall_s"] / s["clean"]["wall_s"]
        s["adv_over_k1_clean"] = s["adv_over_clean"] / (K + 1)
        s["adv_over_clean_cpu"] = s["adv"]["cpu_s"] / s["clean"]["cpu_s"]
    if "torch" in sides:
        t = result["sides"]["torch"]
        for name in sides:
            if name != "torch":
                s = result["sides"][name]
                s["adv_over_torch"] = s["adv"]["wall_s"] / t["adv"]["wall_s"]
                s["adv_over_torch_cpu"] = s["adv"]["cpu_s"] / t["adv"]["cpu_s"]
                s["clean_over_torch"] = s["clean"]["wall_s"] / t["clean"]["wall_s"]
    _print_throughput(result)
    return result


def _print_throughput(res: dict) -> None:
    print(f"\nPreActResNet-18 (width {res['width']}), batch {res['batch']} of 32x32x3, "
          f"PGD-{res['k']} eps 8/255 step 2/255, {res['threads']} intra-op thread(s), "
          f"median of {res['rounds']} rounds")
    print(f"{'side':>9} {'step':>6} {'wall s':>8} {'CPU s':>8} {'img/s':>8} {'spread':>7}")
    for name, s in res["sides"].items():
        for kind in ("clean", "adv"):
            m = s[kind]
            print(f"{name:>9} {kind:>6} {m['wall_s']:>8.3f} {m['cpu_s']:>8.3f} "
                  f"{m['images_per_s']:>8.1f} {m['spread']:>6.0%}")
    for name, s in res["sides"].items():
        line = (f"{name}: adv / clean x{s['adv_over_clean']:.2f} = "
                f"{s['adv_over_k1_clean']:.3f} x (k+1) clean (goal <= 1.15)")
        if "adv_over_torch" in s:
            line += (f"; adv / torch adv x{s['adv_over_torch']:.2f} wall, "
                     f"x{s['adv_over_torch_cpu']:.2f} CPU (goal <= 1.0); clean / torch clean "
                     f"x{s['clean_over_torch']:.2f}")
        print(line)


def memory(args) -> dict:
    script = os.path.abspath(__file__)
    env = _env(args)
    out = {"arch": args.mem_arch, "batch": args.mem_batch, "pgd_steps": args.mem_steps,
           "threads": args.threads, "sides": {}}
    cmds = {"ours": [sys.executable, script, "worker-memory-ours"]}
    if args.torch_python and args.mem_torch:
        cmds["torch"] = [args.torch_python, script, "worker-memory-torch"]
    for name, cmd in cmds.items():
        cmd = [*cmd, *_common(args), "--mem-arch", args.mem_arch, "--mem-batch",
               str(args.mem_batch), "--mem-steps", str(args.mem_steps),
               "--mem-repeats", str(args.mem_repeats)]
        if name == "ours":
            cmd += ["--recompute", args.recompute, "--malloc-threshold",
                    str(args.malloc_threshold), "--convolutions", args.convolutions]
            cmd += ["--reuse-freed-memory"] if args.reuse_freed_memory else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_TAG)]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"memory worker {name} failed ({proc.returncode}):\n"
                             f"{proc.stderr[-3000:]}")
        rec = json.loads(lines[-1][len(_TAG):])
        rec["step_mib"] = rec["peak_mib"] - rec["baseline_mib"]
        out["sides"][name] = rec
        print(f"memory {name}: {args.mem_arch} batch {args.mem_batch}, one PGD-{args.mem_steps} "
              f"step: peak RSS {rec['peak_mib']:.0f} MiB, baseline after building "
              f"{rec['baseline_mib']:.0f} MiB, step adds {rec['step_mib']:.0f} MiB "
              f"({rec['step_wall_s']:.0f} s wall, {rec['step_cpu_s']:.0f} s CPU of which "
              f"{rec['step_sys_s']:.0f} s system, {rec['step_minor_faults']} page faults"
              + (f", oneDNN {'on' if rec['onednn'] else 'off'}" if "onednn" in rec else "")
              + ")", flush=True)
        if args.mem_repeats > 1:
            for i, st in enumerate(rec["steps"]):
                print(f"memory {name} step {i + 1}/{args.mem_repeats}: {st['wall_s']:.1f} s "
                      f"wall, {st['cpu_s']:.1f} s CPU ({st['sys_s']:.1f} s system), "
                      f"{st['minor_faults']} page faults, peak RSS so far "
                      f"{st['peak_mib']:.0f} MiB", flush=True)
    sides = out["sides"]
    if "ours" in sides and "torch" in sides:
        ours, ref = sides["ours"], sides["torch"]
        print(f"memory ours / torch: peak {ours['peak_mib'] / ref['peak_mib']:.2f}x, step wall "
              f"{ours['step_wall_s'] / ref['step_wall_s']:.2f}x, CPU "
              f"{ours['step_cpu_s'] / ref['step_cpu_s']:.2f}x", flush=True)
        for i in range(1, args.mem_repeats):
            a, b = ours["steps"][i], ref["steps"][i]
            print(f"memory ours / torch, step {i + 1}: wall {a['wall_s'] / b['wall_s']:.3f}x, "
                  f"CPU {a['cpu_s'] / b['cpu_s']:.3f}x", flush=True)
    return out


def _machine() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("throughput", "memory", "all", "worker-ours", "worker-torch",
                                    "worker-memory-ours", "worker-memory-torch"))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=64, help="PreActResNet width (64: the real one)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="intra-op threads of both sides")
    p.add_argument("--inter-threads", type=int, default=1,
                   help="inter-op threads of both sides (TensorFlow's executor; torch's pool)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per side and kind")
    p.add_argument("--clean-steps", type=int, default=3, help="clean steps per round (averaged)")
    p.add_argument("--pool", type=int, default=4, help="distinct random batches cycled through")
    p.add_argument("--xla", action="store_true", help="also time ours with jit_compile=True")
    p.add_argument("--direct-too", action="store_true",
                   help="throughput: also time ours with convolutions='direct' (side "
                        "ours-direct)")
    p.add_argument("--fused-bn", action="store_true",
                   help="also time ours with TensorFlow's fused batch-norm kernel patched into "
                   "the model instance (an experiment; the library's layers are unfused)")
    p.add_argument("--jit", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--export", help=argparse.SUPPRESS)
    p.add_argument("--weights", help=argparse.SUPPRESS)
    p.add_argument("--torch-python", default=None,
                   help="a virtualenv's Python with CPU torch (the reference side)")
    p.add_argument("--mem-arch", default="wrn-28-10")
    p.add_argument("--mem-batch", type=int, default=128)
    p.add_argument("--mem-steps", type=int, default=K)
    p.add_argument("--mem-repeats", type=int, default=1,
                   help="memory: training steps per side in its one process, each timed "
                        "separately (the first includes ours' tracing and graph optimisation; "
                        "the peak is over all)")
    p.add_argument("--recompute", nargs="?", const="blocks", default="activations",
                   choices=("none", "activations", "blocks"),
                   help="memory: ours with AdversarialTrainer(recompute=...) (default "
                        "activations, the library's default; the flag alone: blocks)")
    p.add_argument("--convolutions", default="auto", choices=("auto", "direct", "winograd"),
                   help="memory: ours with AdversarialTrainer(convolutions=...) (default auto, "
                        "the library's default: Winograd on a host without a GPU)")
    p.add_argument("--malloc-threshold", type=int, default=0,
                   help="memory: ours calls robustgrad.memory.return_large_blocks(BYTES) "
                        "first (0: not; recompute='blocks' sets 1 MiB itself)")
    p.add_argument("--reuse-freed-memory", action="store_true",
                   help="memory: ours calls robustgrad.memory.reuse_freed_memory() before "
                        "TensorFlow loads (freed blocks kept in one heap for reuse)")
    p.add_argument("--onednn", choices=("on", "off", "tf"), default="tf",
                   help="ours: TensorFlow's own choice of kernels (default; oneDNN only on CPUs "
                        "with AVX-512 VNNI/BF16 or AMX), or oneDNN forced on "
                        "(TF_ENABLE_ONEDNN_OPTS=1) or off")
    p.add_argument("--no-mem-torch", dest="mem_torch", action="store_false",
                   help="memory: skip the PyTorch side")
    p.add_argument("--out", default=os.path.join(_ROOT, "runs", "advtrain_throughput"))
    args = p.parse_args(argv)
    if args.mem_repeats < 1:
        p.error(f"--mem-repeats must be at least 1, got {args.mem_repeats}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    workers = {"worker-ours": worker_ours, "worker-torch": worker_torch,
               "worker-memory-ours": worker_memory_ours, "worker-memory-torch": worker_memory_torch}
    if args.what in workers:
        workers[args.what](args)
        return 0
    os.makedirs(args.out, exist_ok=True)
    result = {"argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "load_average_start": os.getloadavg(), "machine": _machine(),
              "cpus": os.cpu_count(), "data": "random uniform pixels, random labels"}
    if args.what in ("throughput", "all"):
        result["throughput"] = throughput(args)
    if args.what in ("memory", "all"):
        result["memory"] = memory(args)
    result["load_average_end"] = os.getloadavg()
    path = os.path.join(args.out, "advtrain_throughput.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"load average {result['load_average_start']} -> {result['load_average_end']}; "
          f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
