"""Robustness evaluation: an attack ensemble run as a cascade, a report, and sanity checks.

:func:`evaluate` attacks a classifier with several attacks at several budgets and returns an
:class:`EvaluationReport` with, per attack and per eps, the robust accuracy, the attack success
rate (of the originally correct examples it attacked; for targeted attacks the fraction that
reached the target), the mean and max perturbation norm of its successful adversarial examples,
and the work spent (example-rows through forward+backward and forward-only passes). The
per-example worst case over the ensemble is computed as a *cascade*, as AutoAttack does (Croce &
Hein 2020): each attack only runs on the examples every earlier attack failed on, so a strong
first attack makes the rest cheap. ``cascade=False`` runs every attack on every example instead
(each row is then that attack's own robust accuracy). Budgets are processed in increasing order
and an example broken at a smaller eps counts as broken at every larger one (its adversarial
example lies in the larger ball too): the worst case at eps is over every budget up to eps.

Built-in sanity checks (AutoAttack's lesson: an evaluation should check itself for signs of
gradient masking) add warnings to the report and emit them with :mod:`warnings`:

* the model outputs probabilities (rows summing to one) instead of logits;
* input gradients that are zero or non-finite on many examples;
* a gradient-free (black-box) attack breaking examples the gradient attacks could not;
* an unbounded attack (eps = the full input range) failing to bring accuracy to chance;
* robust accuracy increasing with eps, and any output violating its budget or the bounds.

The report prints as a table, saves as JSON, and plots robust accuracy against eps and a grid of
clean / adversarial / perturbation images (matplotlib, Agg backend, PNG).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from typing import Callable

import numpy as np
import tensorflow as tf

from . import _validate as V
from ._base import Attack, call_model, _looks_like_probabilities
from .norms import canonical_norm
from .norms import norm as batch_norm
from .registry import ATTACK_NAMES, make_attack  # noqa: F401  (re-exported)

__all__ = ["evaluate", "EvaluationReport", "AttackRecord", "make_attack", "ATTACK_NAMES"]


# ---------------------------------------------------------------------------------------------
# report


@dataclasses.dataclass
class AttackRecord:
    """One attack at one eps."""

    attack: str
    eps: float
    norm: str
    robust_accuracy: float      # cascade: after this attack and all before it
    success_rate: float         # of the originally correct examples it attacked
    attacked: int               # examples it ran on
    broken: int                 # originally-correct examples it broke (newly, in a cascade)
    mean_norm: float            # over its successful adversarial examples (nan if none)
    max_norm: float
    gradient_passes: int
    forward_passes: int
    seconds: float
    images_per_second: float
    targeted: bool = False


@dataclasses.dataclass
class EvaluationReport:
    """The result of :func:`evaluate`. ``print(report)`` shows the table."""

    norm: str
    eps: list
    attacks: list
    n: int
    clean_accuracy: float
    records: list
    worst_case: dict            # eps -> robust accuracy over the ensemble
    cascade: bool
    bounds: tuple
    warnings: list
    gradient_passes: int
    forward_passes: int
    seconds: float
    carried: dict = dataclasses.field(default_factory=dict)  # eps -> broken at a smaller eps
    examples: dict = dataclasses.field(default_factory=dict, repr=False)

    def table(self) -> str:
        mode = "cascade" if self.cascade else "every attack on every example"
        head = (f"robustness of {self.n} examples, norm {self.norm}, clean accuracy "
                f"{self.clean_accuracy:.3f} ({mode})")
        cols = ["eps", "attack", "robust acc", "success", "attacked", "mean ||d||", "max ||d||",
                "grad passes", "img/s"]
        rows = []
        for r in self.records:
            rows.append([f"{r.eps:g}", r.attack + (" (t)" if r.targeted else ""),
                         f"{r.robust_accuracy:.3f}", f"{r.success_rate:.3f}", str(r.attacked),
                         "-" if math.isnan(r.mean_norm) else f"{r.mean_norm:.4f}",
                         "-" if math.isnan(r.max_norm) else f"{r.max_norm:.4f}",
                         str(r.gradient_passes), f"{r.images_per_second:.0f}"])
        for e in self.eps:
            rows.append([f"{e:g}", "WORST CASE", f"{self.worst_case[e]:.3f}", "", "", "", "", "",
                         ""])
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
        line = "  ".join(c.ljust(w) for c, w in zip(cols, widths))
        out = [head, line, "-" * len(line)]
        out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
        for e, c in self.carried.items():
            if c:
                out.append(f"eps={e:g}: {c} examples already broken at a smaller eps count as "
                           "broken (worst case over every budget up to eps)")
        out.append(f"gradient passes (example rows): {self.gradient_passes}; forward passes: "
                   f"{self.forward_passes}; {self.seconds:.1f} s")
        for w in self.warnings:
            out.append(f"WARNING: {w}")
        return "\n".join(out)

    def __str__(self):
        return self.table()

    def to_dict(self):
        d = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("examples",)}
        d["worst_case"] = {str(k): v for k, v in self.worst_case.items()}
        d["carried"] = {str(k): v for k, v in self.carried.items()}
        d["records"] = [dataclasses.asdict(r) for r in self.records]
        d["bounds"] = [float(np.min(self.bounds[0])), float(np.max(self.bounds[1]))]

        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, list):
                return [clean(x) for x in v]
            return v

        return clean(d)

    def to_json(self, path):
        """Write the report (without image arrays) as JSON; returns the path."""
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
        return path

    def plot(self, path, examples_path=None):
        """PNG of robust accuracy against eps (each attack and the worst case).

        With ``examples_path`` also writes the image grid (:meth:`plot_examples`).
        """
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 4))
        eps = [0.0] + list(self.eps)
        for name in self.attacks:
            acc = [self.clean_accuracy] + [next(r.robust_accuracy for r in self.records
                                                if r.attack == name and r.eps == e)
                                           for e in self.eps]
            ax.plot(eps, acc, marker="o", alpha=0.7, label=name + (" (cumulative)"
                                                                  if self.cascade else ""))
        ax.plot(eps, [self.clean_accuracy] + [self.worst_case[e] for e in self.eps], "k-",
                lw=2.5, marker="s", label="worst case")
        ax.set_xlabel(f"eps ({self.norm})")
        ax.set_ylabel("robust accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("robust accuracy vs eps")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        if examples_path is not None:
            self.plot_examples(examples_path)
        return path

    def plot_examples(self, path, eps=None, n=8):
        """PNG grid: clean, worst-case adversarial and perturbation images at ``eps`` (default
        the largest) for up to ``n`` examples, with true / predicted labels."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        if not self.examples:
            raise ValueError("the report holds no example images")
        e = max(self.examples) if eps is None else eps
        ex = self.examples[e]
        xc, xa = ex["x"][:n], ex["x_adv"][:n]
        k = len(xc)
        fig, axes = plt.subplots(3, k, figsize=(1.3 * k, 4.2), squeeze=False)

        def show(a, img, title, cmap="gray", sym=False):
            img = np.asarray(img)
            if img.ndim == 3 and img.shape[-1] == 1:
                img = img[..., 0]
            if sym:
                m = max(float(np.abs(img).max()), 1e-12)
                a.imshow(img if img.ndim == 2 else img.mean(-1), cmap="seismic", vmin=-m, vmax=m)
            elif img.ndim == 2:
                a.imshow(img, cmap=cmap)
            else:
                a.imshow(np.clip((img - img.min()) / max(np.ptp(img), 1e-12), 0, 1))
            a.set_title(title, fontsize=7)
            a.axis("off")

        for i in range(k):
            show(axes[0, i], xc[i], f"y={ex['y'][i]} p={ex['pred'][i]}")
            robust = np.array_equal(xa[i], xc[i])
            show(axes[1, i], xa[i], "robust: none found" if robust else
                 f"adv p={ex['pred_adv'][i]}")
            show(axes[2, i], xa[i] - xc[i], "perturbation", sym=True)
        fig.suptitle(f"clean / worst-case adversarial / perturbation, eps={e:g} ({self.norm})",
                     fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    def save(self, out_dir):
        """Write ``report.json``, ``report.txt``, ``robust_accuracy.png`` and ``examples.png``."""
        import os

        os.makedirs(out_dir, exist_ok=True)
        paths = {
            "json": self.to_json(os.path.join(out_dir, "report.json")),
            "plot": self.plot(os.path.join(out_dir, "robust_accuracy.png")),
        }
        with open(os.path.join(out_dir, "report.txt"), "w") as f:
            f.write(self.table() + "\n")
        paths["txt"] = os.path.join(out_dir, "report.txt")
        if self.examples:
            paths["examples"] = self.plot_examples(os.path.join(out_dir, "examples.png"))
        return paths


# ---------------------------------------------------------------------------------------------
# evaluation


def _predict(model, x, batch_size):
    out = []
    for i in range(0, len(x), batch_size):
        out.append(tf.convert_to_tensor(call_model(model, tf.constant(x[i:i + batch_size]),
                                                   False)).numpy())
    return np.concatenate(out, axis=0)


def _warn(report_warnings, msg):
    report_warnings.append(msg)
    warnings.warn(msg, UserWarning, stacklevel=3)


def _gradient_check(model, x, y, batch_size, out):
    xs = tf.constant(x[: min(len(x), batch_size)])
    ys = tf.constant(y[: len(xs)].astype(np.int64))
    with tf.GradientTape() as tape:
        tape.watch(xs)
        logits = call_model(model, xs, False)
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.cast(ys, tf.int32), logits=tf.cast(logits, tf.float32)))
    g = tape.gradient(loss, xs)
    if g is None:
        _warn(out, "the loss has no gradient with respect to the input (disconnected model)")
        return
    g = g.numpy().reshape(len(xs), -1)
    if not np.all(np.isfinite(g)):
        _warn(out, f"non-finite input gradients on {int(np.sum(~np.isfinite(g).all(1)))} of "
                   f"{len(g)} examples: gradient attacks cannot be trusted")
    zero = np.mean(np.all(g == 0, axis=1))
    if zero > 0.1:
        _warn(out, f"input gradients are exactly zero on {zero:.0%} of examples (saturation or "
                   "gradient masking): gradient attacks will underestimate vulnerability")


def evaluate(model, x, y, attacks=("fgsm", "pgd", "apgd-ce", "square"), eps=(0.05, 0.1),
             batch_size=256, *, norm="linf", clip_min=None, clip_max=None, cascade=True, seed=0,
             sanity_checks=True, n_examples=8, progress: Callable | None = None,
             target_seed=1) -> EvaluationReport:
    """Evaluate ``model``'s robustness to ``attacks`` at each budget in ``eps``.

    Args:
      model: callable ``model(x, training=False) -> logits``.
      x, y: float inputs ``[N, ...]`` and integer labels ``[N]``.
      attacks: names (see :data:`ATTACK_NAMES`, e.g. ``"fgsm"``, ``"pgd"``, ``"pgd40"``,
        ``"apgd-ce"``, ``"apgd-t"``, ``"square"``) or :class:`attacks.Attack` instances (their
        ``eps``/``norm``/bounds are set per run). Order matters for the cascade: cheap first.
        An attack configured with ``targeted=True`` gets random target classes (``target_seed``).
      eps: one budget or a sequence, in the units of ``x``.
      batch_size: examples per attack call.
      norm: the threat model shared by all attacks.
      clip_min, clip_max: input bounds (scalars or per feature). ``None`` takes the data's range
        (recorded in the report).
      cascade: attack only still-robust examples (AutoAttack style); ``False`` runs every attack
        on every example.
      seed: base seed of the attacks' randomness (deterministic evaluation).
      sanity_checks: run the gradient-masking checks (adds one small unbounded PGD run).
      n_examples: examples kept for the image grid.
      progress: optional ``progress(done, total, description)`` callback.
    """
    norm = canonical_norm(norm)
    xt = V.check_x(x)
    xn = xt.numpy()
    n = len(xn)
    eps_list = sorted({float(e) for e in (eps if isinstance(eps, (list, tuple, np.ndarray))
                                          else [eps])})
    if not eps_list:
        raise ValueError("eps: give at least one budget")
    for e in eps_list:
        V.check_eps(e)
    V.check_positive_int(batch_size, "batch_size")
    if clip_min is None:
        clip_min = float(xn.min())
    if clip_max is None:
        clip_max = float(xn.max())
    V.check_bounds(clip_min, clip_max, xt)
    if isinstance(attacks, (str, Attack)):
        attacks = [attacks]
    specs = [make_attack(a) for a in attacks]
    if not specs:
        raise ValueError("attacks: give at least one attack")
    labels = [s[0] for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"attacks: duplicate names {labels}; wrap in (label, attack) tuples")
    for label, att in specs:
        if norm not in att.norms:
            raise ValueError(f"attacks: {label} does not support norm {norm!r} "
                             f"(supports {att.norms})")

    t_start = time.perf_counter()
    report_warnings: list = []
    logits = _predict(model, xn, batch_size)
    if logits.ndim != 2:
        raise ValueError(f"model must return logits [N, C], got shape {logits.shape}")
    num_classes = logits.shape[1]
    yl = V.check_labels(y, n, num_classes).numpy()
    pred = logits.argmax(1)
    correct = pred == yl
    clean_acc = float(correct.mean())
    fwd_total = n
    if _looks_like_probabilities(logits[: min(n, 256)]):
        _warn(report_warnings, "model outputs look like probabilities (rows sum to 1): attack "
                               "logits, not a softmax (gradient masking)")
    if sanity_checks:
        _gradient_check(model, xn, yl, batch_size, report_warnings)

    rng = np.random.default_rng(target_seed)
    targets = (yl + rng.integers(1, num_classes, size=n)) % num_classes
    total_units = len(eps_list) * len(specs) + (1 if sanity_checks else 0)
    done = 0
    records = []
    worst = {}
    examples = {}
    grad_total = 0

    # an adversarial example at a smaller eps is one at every larger eps: the worst case at eps is
    # over every budget up to eps, and the cascade does not re-attack what is already broken
    prev_broken = np.zeros(n, bool)
    prev_adv = xn.copy()
    carried = {}
    for ei, e in enumerate(eps_list):
        carried[e] = int(prev_broken.sum())
        robust = correct & ~prev_broken if cascade else correct.copy()
        worst_x = prev_adv.copy()
        any_succ = np.zeros(n, bool)
        broken_by_bb = 0
        for ai, (label, att) in enumerate(specs):
            if progress:
                progress(done, total_units, f"{label} eps={e:g}")
            targeted = bool(att.config.get("targeted", False))
            idx = np.flatnonzero(robust) if cascade else np.arange(n)
            t0 = time.perf_counter()
            gp = fp = 0
            succ_all = np.zeros(n, bool)
            reached = np.zeros(n, bool)
            norms_ok = []
            for bi, s in enumerate(range(0, len(idx), batch_size)):
                ib = idx[s:s + batch_size]
                yb = targets[ib] if targeted else yl[ib]
                kw = dict(eps=e, norm=norm, clip_min=clip_min, clip_max=clip_max,
                          seed=int(seed) * 1_000_003 + ei * 10007 + ai * 101 + bi)
                if "early_stop" in _kwonly(att):
                    kw["early_stop"] = True
                res = att.run(model, xn[ib], yb, **kw)
                xa = np.asarray(res.x_adv)
                gp += int(res.gradient_passes)
                fp += int(res.forward_passes)
                pa = _predict(model, xa, batch_size).argmax(1)
                fwd_total += len(ib)
                d = batch_norm(tf.constant(xa - xn[ib]), norm).numpy()
                if np.any(d > e + 1e-6) or np.any(xa < np.asarray(clip_min) - 1e-6) or \
                        np.any(xa > np.asarray(clip_max) + 1e-6):
                    _warn(report_warnings, f"{label} returned points outside the eps={e:g} ball "
                                           "or the bounds (bug)")
                ok = pa != yl[ib]
                succ_all[ib] = ok
                any_succ[ib] |= ok
                reached[ib] = pa == targets[ib]
                newly = ok & robust[ib]
                worst_x[ib[newly]] = xa[newly]
                norms_ok.append(d[ok & correct[ib]])
            secs = time.perf_counter() - t0
            hits = reached if targeted else succ_all
            attacked_correct = correct[idx]
            n_att_correct = int(attacked_correct.sum())
            broken = int((succ_all & robust).sum())
            if att.gradient_free and cascade and ai > 0:
                broken_by_bb += broken
            robust = robust & ~succ_all if cascade else robust
            robust_acc = float(robust.mean()) if cascade else float((correct & ~succ_all).mean())
            nz = np.concatenate(norms_ok) if norms_ok else np.zeros(0)
            records.append(AttackRecord(
                attack=label, eps=e, norm=norm, robust_accuracy=robust_acc,
                success_rate=float(hits[idx][attacked_correct].mean()) if n_att_correct else 0.0,
                attacked=int(len(idx)), broken=broken,
                mean_norm=float(nz.mean()) if len(nz) else float("nan"),
                max_norm=float(nz.max()) if len(nz) else float("nan"),
                gradient_passes=gp, forward_passes=fp, seconds=secs,
                images_per_second=len(idx) / secs if secs > 0 else float("inf"),
                targeted=targeted))
            grad_total += gp
            fwd_total += fp
            done += 1
        if not cascade:
            # worst case = broken by any attack (or at a smaller eps): from the final predictions
            robust = _robust_from(model, worst_x, yl, correct, batch_size)
            fwd_total += n
            regress = int((prev_broken & correct & ~any_succ).sum())
            if sanity_checks and regress:
                _warn(report_warnings, f"eps={e:g}: {regress} examples broken at a smaller eps "
                                       "survived every attack at this larger eps (the attacks "
                                       "are not converging: more steps or restarts)")
        worst[e] = float(robust.mean())
        prev_broken = correct & ~robust
        prev_adv = worst_x
        bb_thr = max(1, int(0.01 * n))
        if sanity_checks and cascade and broken_by_bb >= bb_thr:
            _warn(report_warnings, f"eps={e:g}: a gradient-free attack broke {broken_by_bb} "
                                   "examples the gradient attacks could not: a sign of gradient "
                                   "masking, trust the worst case, not the white-box numbers")
        if not cascade and sanity_checks:
            wb = [r.robust_accuracy for r in records[-len(specs):]
                  if not dict(specs)[r.attack].gradient_free]
            bb = [r.robust_accuracy for r in records[-len(specs):]
                  if dict(specs)[r.attack].gradient_free]
            if wb and bb and min(bb) < min(wb) - 0.01:
                _warn(report_warnings, f"eps={e:g}: a gradient-free attack beats every gradient "
                                       f"attack ({min(bb):.3f} < {min(wb):.3f}): a sign of "
                                       "gradient masking")
        # the grid shows broken examples first, then robust ones (no adversarial found)
        order = np.concatenate([np.flatnonzero(correct & ~robust), np.flatnonzero(robust),
                                np.flatnonzero(~correct)])
        show = order[:n_examples]
        pa = _predict(model, worst_x[show], batch_size).argmax(1)
        examples[e] = {"x": xn[show], "x_adv": worst_x[show], "y": yl[show],
                       "pred": pred[show], "pred_adv": pa}

    accs = [worst[e] for e in sorted(worst)]
    if sanity_checks and any(b > a + 1e-9 for a, b in zip(accs, accs[1:])):
        _warn(report_warnings, "worst-case robust accuracy increases with eps: the attacks are "
                               "not converging (more steps/restarts) or gradients are masked")
    if sanity_checks:
        if progress:
            progress(done, total_units, "unbounded check")
        msg, g, f = _unbounded_check(model, xn, yl, correct, norm, clip_min, clip_max,
                                     num_classes, batch_size, seed)
        grad_total += g
        fwd_total += f
        if msg:
            _warn(report_warnings, msg)
        done += 1
    if progress:
        progress(done, total_units, "done")
    lo, hi = np.asarray(clip_min, float), np.asarray(clip_max, float)
    return EvaluationReport(
        norm=norm, eps=eps_list, attacks=labels, n=n, clean_accuracy=clean_acc, records=records,
        worst_case=worst, cascade=bool(cascade), bounds=(lo, hi), warnings=report_warnings,
        carried=carried,
        gradient_passes=int(grad_total), forward_passes=int(fwd_total),
        seconds=time.perf_counter() - t_start, examples=examples)


def _kwonly(att):
    import inspect

    try:
        sig = inspect.signature(type(att)._run)
    except (TypeError, ValueError):
        return set()
    return {k for k, p in sig.parameters.items() if p.kind == p.KEYWORD_ONLY}


def _robust_from(model, x_adv, y, correct, batch_size):
    return correct & (_predict(model, x_adv, batch_size).argmax(1) == y)


def _unbounded_check(model, x, y, correct, norm, clip_min, clip_max, num_classes, batch_size,
                     seed, n_max=200):
    """PGD with eps = the whole input range: accuracy should fall to chance or below."""
    from .pgd import run_iterative

    idx = np.flatnonzero(correct)[:n_max]
    if len(idx) == 0:
        return None, 0, 0
    lo = np.broadcast_to(np.asarray(clip_min, np.float64), x.shape[1:])
    hi = np.broadcast_to(np.asarray(clip_max, np.float64), x.shape[1:])
    rng_ = hi - lo
    if not np.all(np.isfinite(rng_)):
        return None, 0, 0
    big = {"linf": float(rng_.max()), "l2": float(np.sqrt(np.sum(rng_ ** 2))),
           "l1": float(np.sum(rng_))}[norm]
    res = run_iterative(model, x[idx], y[idx], eps=big, norm=norm, clip_min=clip_min,
                        clip_max=clip_max, seed=seed, steps=40, step_size=big / 10.0,
                        early_stop=True, objective="cw")
    acc = float(np.mean(_predict(model, np.asarray(res.x_adv), batch_size).argmax(1) == y[idx]))
    chance = 1.0 / num_classes
    msg = None
    if acc > chance + 0.05:
        msg = (f"an unbounded attack (eps={big:g}, the full input range) leaves accuracy "
               f"{acc:.3f} on {len(idx)} correctly classified examples, above chance "
               f"({chance:.3f}): gradients are likely masked or the attack is broken")
    return msg, int(res.gradient_passes), int(res.forward_passes) + len(idx)
