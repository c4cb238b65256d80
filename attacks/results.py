"""Per-example evaluation results committed chunk by chunk: resume, shards, one merged report.

An evaluation of many examples (AutoAttack on 10,000 test images takes hours) is cut into
*chunks* of consecutive examples. Each chunk runs the whole cascade (every eps, every attack) on
its own examples with random streams that depend only on the evaluation's seed and the chunk's
index (:func:`chunk_base_seed`; chunk 0 uses the seed itself, so a one-chunk evaluation equals
the unchunked one). Chunks are therefore independent: they can run in any order, on any worker,
and an interrupted evaluation resumed later ends, per example, equal to an uninterrupted one.

:class:`ResultsStore` keeps them in a directory::

    results/manifest.json        what the evaluation is (model and data digests, attacks with
                                 their settings, eps, norm, bounds, seeds, chunk size)
    results/chunk-000000.npz     one per finished chunk, written atomically (a temporary file
                                 replaced into place): a kill at any moment loses at most the
                                 chunk in flight
    results/certified-crown-000000.npz
                                 with certification, one per chunk and bound method: per eps
                                 the verified mask, committed the same way
    results/smoothed-000000.npz  ``robustgrad certify --method smoothing`` (a store whose
                                 settings say ``kind: certify``): per chunk the smoothed
                                 predictions and certified radii

A store opened with different settings than its manifest raises a ``ValueError`` that names
each difference; a chunk file that is not one of ours (or was damaged) raises one naming the
file. :func:`merge_outcomes` joins the chunks' :class:`~attacks.cascade.BudgetOutcome` lists
into the outcome of the whole set (integer counts, so the merged robust accuracies are exact).

>>> import numpy as np, tempfile
>>> split_chunks(5, 2)
[(0, 2), (2, 4), (4, 5)]
>>> chunk_base_seed(7, 0), chunk_base_seed(7, 1) == chunk_base_seed(7, 1) != 7
(7, True)
>>> store = ResultsStore(tempfile.mkdtemp(), {"eps": [0.1], "n": 5})
>>> store.finished()
[]
>>> ResultsStore(store.directory, {"eps": [0.2], "n": 5})
Traceback (most recent call last):
...
ValueError: resume: the results in ... were made with different settings: eps: recorded [0.1], now [0.2]
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from robustgrad.atomic import replacing

from .cascade import BudgetOutcome, predict_logits
from .report import AttackRecord

__all__ = ["DEFAULT_CHUNK_SIZE", "RESULTS_FORMAT", "ResultsStore", "chunk_arrays",
           "chunk_base_seed", "chunk_from_arrays",
           "data_digest", "margins", "merge_outcomes", "merge_records", "model_digest",
           "split_chunks"]

RESULTS_FORMAT = "robustgrad-evaluation-results"
"""The ``format`` field of every manifest and chunk file of a :class:`ResultsStore`."""
RESULTS_VERSION = 1
DEFAULT_CHUNK_SIZE = 1000
"""Examples per chunk when the caller does not say: a chunk of AutoAttack on a small model is a
few minutes of work, the most an interruption loses."""

_MANIFEST = "manifest.json"
# settings["kind"] -> what a store holds (an evaluation's settings have no kind)
_KINDS = {None: "an evaluation (robustgrad evaluate)",
          "certify": "a certification (robustgrad certify)"}


def split_chunks(n: int, chunk_size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: ``n`` examples in consecutive chunks of ``chunk_size``."""
    return [(start, min(start + chunk_size, n)) for start in range(0, n, chunk_size)]


def chunk_base_seed(seed: int, chunk: int) -> int:
    """The base seed of chunk ``chunk``'s cascade: ``seed`` itself for chunk 0 (a one-chunk
    evaluation equals the unchunked one), otherwise a 31-bit value drawn from
    ``numpy.random.SeedSequence([seed, chunk])``: depends only on the seed and the chunk."""
    if chunk == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed) % 2**63, int(chunk)]).generate_state(1)[0]
               % (2**31 - 1))


def data_digest(x: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of the examples and labels (shapes and dtypes included)."""
    h = hashlib.sha256()
    for a in (np.ascontiguousarray(x), np.ascontiguousarray(y)):
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def model_digest(model: Any) -> str | None:
    """SHA-256 of a model's weights (anything with a ``weights`` list, a Keras model), or
    ``None`` for a plain callable (whose identity cannot be checked)."""
    weights = getattr(model, "weights", None)
    if not isinstance(weights, (list, tuple)) or not weights:
        return None
    h = hashlib.sha256()
    for w in weights:
        a = np.asarray(w.numpy() if hasattr(w, "numpy") else w)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def margins(model: Callable, x: np.ndarray, y: np.ndarray, batch_size: int) -> np.ndarray:
    """Per example the logit margin ``z_y - max_{j != y} z_j`` ``[N]`` (float64): positive
    where the model is right, the smaller the closer to the decision boundary."""
    if len(x) == 0:
        return np.zeros(0)
    z = predict_logits(model, x, batch_size).astype(np.float64)
    rows = np.arange(len(y))
    own = z[rows, y]
    z[rows, y] = -np.inf
    return own - z.max(axis=1)


_DIGESTS = {"model": "other weights than the recorded run's (another model file, or the file "
                     "changed)",
            "data": "other examples than the recorded run's (another --data, or --limit)"}


def _difference(key: str, recorded: Any, now: Any) -> str:
    """One setting that differs from the manifest's, said for a reader: the model's and the
    data's SHA-256 digests are named by what they stand for, not printed."""
    if key in _DIGESTS and all(isinstance(v, str) and len(v) == 64 for v in (recorded, now)):
        return f"{key}: {_DIGESTS[key]}"
    return f"{key}: recorded {recorded!r}, now {now!r}"


class ResultsStore:
    """The finished chunks of one evaluation, in ``directory`` (created when missing).

    ``settings`` (JSON-ready) say what the evaluation is; a directory that already holds a
    manifest must have been made with the same settings (else ``ValueError`` naming each
    difference), and its finished chunks are reused: that is resuming.
    """

    def __init__(self, directory: str | os.PathLike, settings: Mapping[str, Any]) -> None:
        self.directory = os.fspath(directory)
        self.settings = json.loads(json.dumps(dict(settings)))  # JSON-normalised copy
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, _MANIFEST)
        if os.path.exists(path):
            recorded = self._read_manifest(path)
            if recorded.get("kind") != self.settings.get("kind"):
                raise ValueError(f"resume: {self.directory} holds the results of "
                                 f"{_KINDS.get(recorded.get('kind'), 'another run')}, not of "
                                 f"{_KINDS.get(self.settings.get('kind'), 'this run')}; use "
                                 "another --out")
            diff = [_difference(k, recorded.get(k), self.settings.get(k))
                    for k in sorted(set(recorded) | set(self.settings))
                    if recorded.get(k) != self.settings.get(k)]
            if diff:
                raise ValueError(f"resume: the results in {self.directory} were made with "
                                 f"different settings: {'; '.join(diff)}")
        else:
            with replacing(path) as tmp, open(tmp, "w") as f:
                json.dump({"format": RESULTS_FORMAT, "version": RESULTS_VERSION,
                           "settings": self.settings}, f, indent=1)

    def _read_manifest(self, path: str) -> dict[str, Any]:
        try:
            with open(path) as f:
                data = json.load(f)
            if data.get("format") != RESULTS_FORMAT or not isinstance(data.get("settings"), dict):
                raise ValueError("not an evaluation manifest")
            if data.get("version") != RESULTS_VERSION:
                raise ValueError(f"version {data.get('version')!r}, this library reads "
                                 f"{RESULTS_VERSION}")
        except (OSError, ValueError, AttributeError) as error:
            raise ValueError(f"resume: {path} is not a results manifest of this library "
                             f"({error}); use another --out or remove it") from None
        return data["settings"]

    def path(self, chunk: int) -> str:
        """The file of chunk ``chunk``."""
        return os.path.join(self.directory, f"chunk-{int(chunk):06d}.npz")

    def finished(self) -> list[int]:
        """The indices of the chunks already committed, sorted."""
        return self._indices("chunk-")

    def _indices(self, prefix: str) -> list[int]:
        """The sorted ``k`` of the files ``{prefix}{k:06d}.npz`` in the directory."""
        out = []
        for name in os.listdir(self.directory):
            if name.startswith(prefix) and name.endswith(".npz"):
                try:
                    out.append(int(name[len(prefix):-4]))
                except ValueError:
                    continue
        return sorted(out)

    # -- certificates: one file per (bound method, chunk), beside the attacks' chunks. The
    # manifest already pins what a certificate depends on (model, data, eps, norm, bounds,
    # chunk size), so a resume may add --certify, or change its method, and reuse the attacks.

    def certificate_path(self, method: str, chunk: int) -> str:
        """The file of chunk ``chunk``'s certificate by bound method ``method``."""
        return os.path.join(self.directory, f"certified-{_method_tag(method)}-{int(chunk):06d}.npz")

    def finished_certificates(self, method: str) -> list[int]:
        """The indices of the chunks whose ``method`` certificate is committed, sorted."""
        return self._indices(f"certified-{_method_tag(method)}-")

    def commit_certificate(self, method: str, chunk: int, start: int, budgets: Sequence[float],
                           verified: Sequence[np.ndarray], seconds: Sequence[float]) -> None:
        """Write chunk ``chunk``'s certificate atomically: per budget ``k`` the bool mask
        ``verified_k`` ``[n]`` (examples ``start ...``) and the seconds it took."""
        meta = {"format": RESULTS_FORMAT, "version": RESULTS_VERSION, "kind": "certificate",
                "method": method, "chunk": int(chunk), "start": int(start),
                "n": int(len(verified[0])) if len(verified) else 0,
                "eps": [float(e) for e in budgets], "seconds": [float(t) for t in seconds]}
        arrays: dict[str, Any] = {"meta": np.array(json.dumps(meta))}
        for k, v in enumerate(verified):
            arrays[f"verified_{k}"] = np.asarray(v, bool)
        with replacing(self.certificate_path(method, chunk)) as tmp:
            np.savez_compressed(tmp, **arrays)

    def load_certificate(self, method: str, chunk: int, start: int, size: int,
                         budgets: Sequence[float]) -> tuple[list[np.ndarray], list[float]]:
        """Chunk ``chunk``'s ``method`` certificate: per budget the verified mask ``[size]``
        (bool) and its seconds, checked against what the evaluation expects of the chunk;
        ``ValueError`` naming the file when it is not that."""
        path = self.certificate_path(method, chunk)
        try:
            if not zipfile.is_zipfile(path):
                raise ValueError("not an npz archive")
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                if (meta.get("format"), meta.get("kind"), meta.get("method"),
                        meta.get("chunk")) != (RESULTS_FORMAT, "certificate", method, chunk):
                    raise ValueError(f"not a {method} certificate of chunk {chunk}")
                if meta.get("start") != start or meta.get("n") != size or \
                        meta.get("eps") != [float(e) for e in budgets]:
                    raise ValueError(f"it holds examples {meta.get('start')}.. "
                                     f"({meta.get('n')}) at eps {meta.get('eps')}, expected "
                                     f"{start}.. ({size}) at eps {list(budgets)}")
                verified = [np.asarray(data[f"verified_{k}"], bool) for k in range(len(budgets))]
            if any(v.shape != (size,) for v in verified):
                raise ValueError("its masks do not hold one entry per example")
            return verified, [float(t) for t in meta["seconds"]]
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError) as error:
            raise ValueError(f"resume: {path} is not a readable certificate of this evaluation "
                             f"({error}); remove it to recompute that chunk's certificate") \
                from None

    # -- randomized smoothing (``robustgrad certify --method smoothing``): one file per chunk,
    # per example the smoothed prediction (or ABSTAIN) and its certified L2 radius.

    def smoothing_path(self, chunk: int) -> str:
        """The file of chunk ``chunk``'s smoothing certificates."""
        return os.path.join(self.directory, f"smoothed-{int(chunk):06d}.npz")

    def finished_smoothing(self) -> list[int]:
        """The indices of the chunks whose smoothing certificates are committed, sorted."""
        return self._indices("smoothed-")

    def commit_smoothing(self, chunk: int, start: int, labels: np.ndarray, radii: np.ndarray,
                         seconds: float) -> None:
        """Write chunk ``chunk``'s smoothing certificates atomically: the smoothed predictions
        ``labels`` ``[n]`` (int64, ``ABSTAIN`` where it abstains) and certified radii ``radii``
        ``[n]`` (float64) of examples ``start ...``, and the seconds they took."""
        meta = {"format": RESULTS_FORMAT, "version": RESULTS_VERSION, "kind": "smoothing",
                "chunk": int(chunk), "start": int(start), "n": int(len(labels)),
                "seconds": float(seconds)}
        with replacing(self.smoothing_path(chunk)) as tmp:
            np.savez_compressed(tmp, meta=np.array(json.dumps(meta)),
                                labels=np.asarray(labels, np.int64),
                                radii=np.asarray(radii, np.float64))

    def load_smoothing(self, chunk: int, start: int,
                       size: int) -> tuple[np.ndarray, np.ndarray, float]:
        """Chunk ``chunk``'s smoothing certificates ``(labels [size], radii [size], seconds)``,
        checked against what the run expects of the chunk; ``ValueError`` naming the file when
        it is not that."""
        path = self.smoothing_path(chunk)
        try:
            if not zipfile.is_zipfile(path):
                raise ValueError("not an npz archive")
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                if (meta.get("format"), meta.get("kind"), meta.get("chunk")) != (
                        RESULTS_FORMAT, "smoothing", chunk):
                    raise ValueError(f"not the smoothing certificates of chunk {chunk}")
                if meta.get("start") != start or meta.get("n") != size:
                    raise ValueError(f"it holds examples {meta.get('start')}.. "
                                     f"({meta.get('n')}), expected {start}.. ({size})")
                labels = np.asarray(data["labels"], np.int64)
                radii = np.asarray(data["radii"], np.float64)
            if labels.shape != (size,) or radii.shape != (size,):
                raise ValueError("its arrays do not hold one entry per example")
            return labels, radii, float(meta["seconds"])
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError) as error:
            raise ValueError(f"resume: {path} is not a readable chunk of this certification "
                             f"({error}); remove it to recompute that chunk") from None

    def commit(self, chunk: int, start: int, outcomes: Sequence[BudgetOutcome],
               margin: Sequence[np.ndarray]) -> None:
        """Write chunk ``chunk`` (examples ``start ...``) atomically."""
        self.commit_arrays(chunk, chunk_arrays(chunk, start, outcomes, margin))

    def commit_arrays(self, chunk: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Write chunk ``chunk`` atomically from its :func:`chunk_arrays` (what a worker
        returns)."""
        with replacing(self.path(chunk)) as tmp:
            np.savez_compressed(tmp, **dict[str, Any](arrays))

    def load(self, chunk: int, start: int, size: int,
             budgets: Sequence[float]) -> tuple[list[BudgetOutcome], list[np.ndarray]]:
        """Chunk ``chunk``'s outcomes (one per eps) and margins, checked against what the
        evaluation expects of it (``start``, ``size`` examples, the ``budgets``)."""
        path = self.path(chunk)
        try:
            if not zipfile.is_zipfile(path):
                raise ValueError("not an npz archive")
            with np.load(path, allow_pickle=False) as data:
                return chunk_from_arrays(data, chunk, start, size, budgets)
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError) as error:
            raise ValueError(f"resume: {path} is not a readable chunk of this evaluation "
                             f"({error}); remove it to recompute that chunk") from None


def _method_tag(method: str) -> str:
    """``method`` as a file-name part (the bound methods are short lowercase names)."""
    if not isinstance(method, str) or not method.replace("-", "").isalnum():
        raise ValueError(f"certificate method must be a bound method name, got {method!r}")
    return method


def chunk_arrays(chunk: int, start: int, outcomes: Sequence[BudgetOutcome],
                 margin: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """Chunk ``chunk``'s outcomes (one per eps) and margins as plain arrays: ``meta`` (a JSON
    string: the chunk, its first example, the budgets' counts and records) and per budget ``k``
    ``robust_k`` ``[n]`` bool, ``broken_by_k`` ``[n]`` int64, ``x_worst_k`` ``[n, ...]``,
    ``margin_k`` ``[n]`` float64: what a chunk file holds and what a worker sends back."""
    meta = {"format": RESULTS_FORMAT, "version": RESULTS_VERSION, "chunk": int(chunk),
            "start": int(start), "n": len(outcomes[0].robust) if outcomes else 0,
            "budgets": [_outcome_meta(o) for o in outcomes]}
    arrays: dict[str, np.ndarray] = {"meta": np.array(json.dumps(meta))}
    for k, (o, m) in enumerate(zip(outcomes, margin)):
        arrays[f"robust_{k}"] = np.asarray(o.robust, bool)
        arrays[f"broken_by_{k}"] = np.asarray(o.broken_by, np.int64)
        arrays[f"x_worst_{k}"] = np.asarray(o.x_worst)
        arrays[f"margin_{k}"] = np.asarray(m, np.float64)
    return arrays


def chunk_from_arrays(data: Mapping[str, Any], chunk: int, start: int, size: int,
                      budgets: Sequence[float]) -> tuple[list[BudgetOutcome], list[np.ndarray]]:
    """The outcomes and margins of :func:`chunk_arrays` ``data``, checked against what the
    evaluation expects of chunk ``chunk`` (``start``, ``size`` examples, the ``budgets``);
    ``ValueError`` when they do not match."""
    meta = json.loads(str(data["meta"]))
    if meta.get("format") != RESULTS_FORMAT or meta.get("chunk") != chunk:
        raise ValueError("not a chunk of this evaluation")
    if meta.get("start") != start or meta.get("n") != size or \
            len(meta.get("budgets", [])) != len(budgets):
        raise ValueError(f"it holds examples {meta.get('start')}.. "
                         f"({meta.get('n')}) at {len(meta.get('budgets', []))} "
                         f"budgets, expected {start}.. ({size}) at {len(budgets)}")
    outcomes, margin = [], []
    for k, (bm, eps) in enumerate(zip(meta["budgets"], budgets)):
        if bm["eps"] != eps:
            raise ValueError(f"budget {k} is eps {bm['eps']}, expected {eps}")
        arrays = {name: data[f"{name}_{k}"] for name in
                  ("robust", "broken_by", "x_worst", "margin")}
        if any(len(a) != size for a in arrays.values()):
            raise ValueError("its arrays do not hold one row per example")
        outcomes.append(_outcome_from(bm, arrays))
        margin.append(arrays["margin"])
    return outcomes, margin

_RECORD_FIELDS = ("attack", "eps", "norm", "attacked", "broken", "gradient_passes",
                  "forward_passes", "seconds", "targeted")


def _outcome_meta(o: BudgetOutcome) -> dict[str, Any]:
    return {"eps": o.eps, "carried": o.carried,
            "broken_by_gradient_free": o.broken_by_gradient_free, "regressed": o.regressed,
            "outside_budget": list(o.outside_budget), "gradient_passes": o.gradient_passes,
            "forward_passes": o.forward_passes,
            "records": [{f: getattr(r, f) for f in _RECORD_FIELDS} for r in o.records],
            "tallies": [{k: (None if isinstance(v, float) and np.isnan(v) else v)
                         for k, v in t.items()} for t in o.tallies]}


def _outcome_from(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> BudgetOutcome:
    tallies = [{k: (float("nan") if v is None else v) for k, v in t.items()}
               for t in meta["tallies"]]
    n = len(arrays["robust"])
    records = [_record_from(r, t, n) for r, t in zip(meta["records"], tallies)]
    return BudgetOutcome(
        eps=meta["eps"], records=records, robust=arrays["robust"], x_worst=arrays["x_worst"],
        carried=meta["carried"], broken_by_gradient_free=meta["broken_by_gradient_free"],
        regressed=meta["regressed"], outside_budget=list(meta["outside_budget"]),
        gradient_passes=meta["gradient_passes"], forward_passes=meta["forward_passes"],
        broken_by=arrays["broken_by"], tallies=tallies)


def _record_from(fields: Mapping[str, Any], tally: Mapping[str, float], n: int) -> AttackRecord:
    """An :class:`AttackRecord` over ``n`` examples from its plain fields and its tally."""
    count = tally["distance_count"]
    seconds = fields["seconds"]
    return AttackRecord(
        attack=fields["attack"], eps=fields["eps"], norm=fields["norm"],
        robust_accuracy=tally["robust"] / n if n else 0.0,
        success_rate=tally["hits"] / tally["attacked_correct"] if tally["attacked_correct"]
        else 0.0,
        attacked=fields["attacked"], broken=fields["broken"],
        mean_norm=tally["distance_sum"] / count if count else float("nan"),
        max_norm=tally["distance_max"] if count else float("nan"),
        gradient_passes=fields["gradient_passes"], forward_passes=fields["forward_passes"],
        seconds=seconds,
        images_per_second=fields["attacked"] / seconds if seconds > 0 else float("inf"),
        targeted=fields["targeted"])


def merge_records(parts: Sequence[Sequence[AttackRecord]], tallies: Sequence[Sequence[dict]],
                  n: int) -> tuple[list[AttackRecord], list[dict]]:
    """The records of one eps over every chunk (``parts[c][j]``: chunk ``c``'s record of attack
    ``j``, ``tallies`` alike), for ``n`` examples in all; returns the records and tallies."""
    merged, merged_tallies = [], []
    for j, first in enumerate(parts[0]):
        rows = [p[j] for p in parts]
        ts = [t[j] for t in tallies]
        tally = {k: sum(t[k] for t in ts) for k in ("robust", "attacked_correct", "hits",
                                                   "distance_sum", "distance_count")}
        maxima = [t["distance_max"] for t in ts if t["distance_count"]]
        tally["distance_max"] = max(maxima) if maxima else float("nan")
        fields = {f: getattr(first, f) for f in _RECORD_FIELDS}
        for f in ("attacked", "broken", "gradient_passes", "forward_passes", "seconds"):
            fields[f] = sum(getattr(r, f) for r in rows)
        merged.append(_record_from(fields, tally, n))
        merged_tallies.append(tally)
    return merged, merged_tallies


def merge_outcomes(chunks: Sequence[Sequence[BudgetOutcome]]) -> list[BudgetOutcome]:
    """One :class:`BudgetOutcome` per eps for the examples of every chunk, in chunk order
    (``chunks[c][k]``: chunk ``c`` at budget ``k``)."""
    if len(chunks) == 1:
        return list(chunks[0])
    out = []
    for k in range(len(chunks[0])):
        parts = [c[k] for c in chunks]
        n = sum(len(p.robust) for p in parts)
        records, tallies = merge_records([p.records for p in parts],
                                         [p.tallies for p in parts], n)
        outside: list[str] = []
        for p in parts:
            outside += [label for label in p.outside_budget if label not in outside]
        out.append(BudgetOutcome(
            eps=parts[0].eps, records=records,
            robust=np.concatenate([p.robust for p in parts]),
            x_worst=np.concatenate([p.x_worst for p in parts]),
            carried=sum(p.carried for p in parts),
            broken_by_gradient_free=sum(p.broken_by_gradient_free for p in parts),
            regressed=sum(p.regressed for p in parts), outside_budget=outside,
            gradient_passes=sum(p.gradient_passes for p in parts),
            forward_passes=sum(p.forward_passes for p in parts),
            broken_by=np.concatenate([p.broken_by for p in parts]), tallies=tallies))
    return out
