"""The result of :func:`attacks.evaluate`: one :class:`AttackRecord` per attack and eps, and the
:class:`EvaluationReport` that prints them as a table, saves JSON and plots them.

The report's numbers follow AutoAttack's reporting (Croce & Hein 2020): robust accuracy per
attack (cumulative in a cascade), the per-example worst case over the ensemble at each eps, the
success rate of each attack on the correctly classified examples it attacked, the norms of its
successful perturbations, and the work spent in example-rows through the model.

>>> record = AttackRecord(attack="fgsm", eps=0.1, norm="linf", robust_accuracy=0.5,
...                       success_rate=0.5, attacked=4, broken=2, mean_norm=0.1, max_norm=0.1,
...                       gradient_passes=4, forward_passes=4, seconds=0.5,
...                       images_per_second=8.0)
>>> report = EvaluationReport(norm="linf", eps=[0.1], attacks=["fgsm"], n=4, clean_accuracy=1.0,
...                           records=[record], worst_case={0.1: 0.5}, cascade=True,
...                           bounds=(0.0, 1.0), warnings=[], gradient_passes=4,
...                           forward_passes=12, seconds=0.6)
>>> print(report)  # doctest: +NORMALIZE_WHITESPACE
robustness of 4 examples, norm linf, clean accuracy 1.000 (cascade)
eps  attack      robust acc  success  attacked  mean ||d||  max ||d||  grad passes  img/s
-----------------------------------------------------------------------------------------
0.1  fgsm        0.500       0.500    4         0.1000      0.1000     4            8
0.1  WORST CASE  0.500
gradient passes (example rows): 4; forward passes: 12; 0.6 s
>>> report.to_dict()["worst_case"]
{'0.1': 0.5}
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import numpy as np

from robustgrad import checks as _checks
from robustgrad.atomic import replacing, save_figure

__all__ = ["AttackRecord", "EvaluationReport"]


@dataclasses.dataclass
class AttackRecord:
    """One attack at one eps (a row of the table, an entry of the JSON ``records``)."""

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
    """The result of :func:`attacks.evaluate`. ``print(report)`` shows the table.

    ``examples`` maps eps to the image grid's arrays: ``x`` and ``x_adv`` ``[k, ...]`` (the
    worst-case adversarial input, ``x`` itself where none was found), ``y``, ``pred`` and
    ``pred_adv`` ``[k]`` integer labels.
    """

    norm: str
    eps: list[float]
    attacks: list[str]
    n: int
    clean_accuracy: float
    records: list[AttackRecord]
    worst_case: dict[float, float]  # eps -> robust accuracy over the ensemble
    cascade: bool
    bounds: tuple[Any, Any]     # (clip_min, clip_max) as float arrays (scalars or per feature)
    warnings: list[str]
    gradient_passes: int
    forward_passes: int
    seconds: float
    carried: dict[float, int] = dataclasses.field(default_factory=dict)  # eps -> broken earlier
    examples: dict[float, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict,
                                                                     repr=False)
    #: the bound method of ``evaluate(certify=...)``, or None
    certify: str | None = None
    #: eps -> ``{"method", "certified_accuracy", "attacked_accuracy", "undecided",
    #: "undecided_count", "seconds"}``: the certificate's lower bound beside the attacks' upper
    #: bound, and the fraction of examples neither decides
    certified: dict[float, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: a chunked evaluation's per-example arrays ``[N]`` (``index``, ``label``,
    #: ``clean_prediction``, ``correct``, and per eps ``robust@EPS``, ``broken_by@EPS`` (the
    #: position of the first attack that broke the example, -1 robust, -2 broken at a smaller
    #: eps, -3 wrong on the clean input), ``margin@EPS`` (the logit margin at the worst-case
    #: input)); written as ``per_example.npz`` by :meth:`save`
    per_example: dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)

    def table(self) -> str:
        """The report as text: a row per attack and eps, the worst case, the work, warnings."""
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
            if e in self.certified:
                c = self.certified[e]
                rows.append([f"{e:g}", f"CERTIFIED ({c['method']})",
                             f"{c['certified_accuracy']:.3f}", "", "", "", "", "", ""])
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
        line = "  ".join(c.ljust(w) for c, w in zip(cols, widths))
        out = [head, line, "-" * len(line)]
        out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
        for e, count in self.carried.items():
            if count:
                out.append(f"eps={e:g}: {count} examples already broken at a smaller eps count as "
                           "broken (worst case over every budget up to eps)")
        for e, c in self.certified.items():
            out.append(f"eps={e:g}: certified {c['certified_accuracy']:.3f} <= accuracy under "
                       f"any attack <= attacked {c['attacked_accuracy']:.3f}; undecided "
                       f"{c['undecided']:.3f} ({c['undecided_count']} examples robust to the "
                       f"attacks, not verified)")
        out.append(f"gradient passes (example rows): {self.gradient_passes}; forward passes: "
                   f"{self.forward_passes}; {self.seconds:.1f} s")
        for w in self.warnings:
            out.append(f"WARNING: {w}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready Python values (no image arrays; non-finite numbers -> None)."""
        fields = {k: v for k, v in dataclasses.asdict(self).items()
                  if k not in ("examples", "per_example")}
        fields["worst_case"] = {str(e): acc for e, acc in self.worst_case.items()}
        fields["carried"] = {str(e): count for e, count in self.carried.items()}
        fields["certified"] = {str(e): dict(c) for e, c in self.certified.items()}
        fields["records"] = [dataclasses.asdict(r) for r in self.records]
        fields["bounds"] = [float(np.min(self.bounds[0])), float(np.max(self.bounds[1]))]
        return _json_ready(fields)

    def to_json(self, path: str | os.PathLike) -> str | os.PathLike:
        """Write the report (without image arrays) as JSON; returns the path."""
        with replacing(path) as tmp, open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
        return path

    def plot(self, path: str | os.PathLike,
             examples_path: str | os.PathLike | None = None) -> str | os.PathLike:
        """PNG of robust accuracy against eps (each attack and the worst case).

        With ``examples_path`` also writes the image grid (:meth:`plot_examples`).
        """
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 4))
        budgets = [0.0] + list(self.eps)
        for name in self.attacks:
            accuracies = [self.clean_accuracy] + [next(r.robust_accuracy for r in self.records
                                                       if r.attack == name and r.eps == e)
                                                  for e in self.eps]
            ax.plot(budgets, accuracies, marker="o", alpha=0.7,
                    label=name + (" (cumulative)" if self.cascade else ""))
        ax.plot(budgets, [self.clean_accuracy] + [self.worst_case[e] for e in self.eps], "k-",
                lw=2.5, marker="s", label="worst case")
        if self.certified:
            method = next(iter(self.certified.values()))["method"]
            ax.plot(budgets, [self.clean_accuracy] + [self.certified[e]["certified_accuracy"]
                                                      for e in self.eps], "g--", lw=2,
                    marker="^", label=f"certified ({method})")
        ax.set_xlabel(f"eps ({self.norm})")
        ax.set_ylabel("robust accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("robust accuracy vs eps")
        fig.tight_layout()
        save_figure(fig, path, dpi=110)
        if examples_path is not None:
            self.plot_examples(examples_path)
        return path

    def plot_examples(self, path: str | os.PathLike, eps: float | None = None,
                      n: int = 8) -> str | os.PathLike:
        """PNG grid: clean, worst-case adversarial and perturbation images at ``eps`` (default
        the largest) for up to ``n`` examples, with true / predicted labels."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        count = _checks.positive_int(n, "n")
        if not self.examples:
            raise ValueError("the report holds no example images")
        budget = max(self.examples) if eps is None else eps
        if budget not in self.examples:
            raise ValueError(f"eps must be one of the report's budgets {sorted(self.examples)}, "
                             f"got {eps!r}")
        grid = self.examples[budget]
        clean, adversarial = grid["x"][:count], grid["x_adv"][:count]
        count = len(clean)
        fig, axes = plt.subplots(3, count, figsize=(1.3 * count, 4.2), squeeze=False)
        for i in range(count):
            _show_image(axes[0, i], clean[i], f"y={grid['y'][i]} p={grid['pred'][i]}")
            none_found = np.array_equal(adversarial[i], clean[i])
            _show_image(axes[1, i], adversarial[i], "robust: none found" if none_found else
                        f"adv p={grid['pred_adv'][i]}")
            _show_image(axes[2, i], adversarial[i] - clean[i], "perturbation", signed=True)
        fig.suptitle(f"clean / worst-case adversarial / perturbation, eps={budget:g} "
                     f"({self.norm})", fontsize=9)
        fig.tight_layout()
        save_figure(fig, path, dpi=110)
        return path

    def save(self, out_dir: str | os.PathLike) -> dict[str, str | os.PathLike]:
        """Write ``report.json``, ``report.txt``, ``robust_accuracy.png`` and ``examples.png``
        under ``out_dir``; returns their paths by kind (``json``, ``plot``, ``txt``,
        ``examples``)."""
        os.makedirs(out_dir, exist_ok=True)
        paths = {
            "json": self.to_json(os.path.join(out_dir, "report.json")),
            "plot": self.plot(os.path.join(out_dir, "robust_accuracy.png")),
        }
        with replacing(os.path.join(out_dir, "report.txt")) as tmp, open(tmp, "w") as f:
            f.write(self.table() + "\n")
        paths["txt"] = os.path.join(out_dir, "report.txt")
        if self.examples:
            paths["examples"] = self.plot_examples(os.path.join(out_dir, "examples.png"))
        if self.per_example:
            paths["per_example"] = os.path.join(out_dir, "per_example.npz")
            with replacing(paths["per_example"]) as tmp:
                np.savez_compressed(tmp, **dict[str, Any](self.per_example))
        return paths

    def summary(self, model: str, dataset: str) -> dict[str, Any]:
        """A RobustBench-style entry a user can quote and compare: the model's and the
        dataset's names, the threat model, clean and robust accuracy per eps (the worst case
        over the attacks; with ``"autoattack"`` the AutoAttack robust accuracy), the attacks in
        order, the examples and the seconds.

        >>> r = EvaluationReport("linf", [0.1], ["fgsm"], 4, 1.0, [], {0.1: 0.5}, True,
        ...                      (0.0, 1.0), [], 8, 4, 1.5)
        >>> r.summary("mine", "digits")["robust_accuracy"]
        {'0.1': 0.5}
        """
        return _json_ready({
            "model": model, "dataset": dataset, "threat_model": self.norm.capitalize(),
            "eps": self.eps, "clean_accuracy": self.clean_accuracy,
            "robust_accuracy": {f"{e:g}": self.worst_case[e] for e in self.eps},
            "attacks": self.attacks, "cascade": self.cascade, "examples": self.n,
            "seconds": self.seconds, "warnings": len(self.warnings),
            "library": "robustgrad"})


def _json_ready(value: Any) -> Any:
    """``value`` with non-finite floats replaced by ``None`` (JSON has no NaN), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    return value


def _show_image(axis, image, title: str, signed: bool = False) -> None:
    """One panel of the grid: grey for one channel, RGB rescaled to [0, 1], or a signed map
    (blue-white-red, symmetric around 0) for a perturbation."""
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.ndim == 1:  # vector data ([N, d]): one row of d pixels, not an error after the report
        image = image[None, :]
    if signed:
        limit = max(float(np.abs(image).max()), 1e-12)
        axis.imshow(image if image.ndim == 2 else image.mean(-1), cmap="seismic", vmin=-limit,
                    vmax=limit)
    elif image.ndim == 2:
        axis.imshow(image, cmap="gray")
    else:
        axis.imshow(np.clip((image - image.min()) / max(np.ptp(image), 1e-12), 0, 1))
    axis.set_title(title, fontsize=7)
    axis.axis("off")
