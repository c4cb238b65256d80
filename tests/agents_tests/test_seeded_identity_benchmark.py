"""Checks of ``benchmarks/seeded_identity.py`` that need no training: every shipped preset has a
row, the digests see a last-bit change, a dtype or a shape, and the comparison says which rows
differ and by how much."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("seeded_identity")


def test_every_shipped_preset_has_a_cli_row(bench):
    from agents.core.presets import load_presets

    assert sorted(bench.CLI_STEPS) == sorted(load_presets())
    for name, (algo, env, preset, steps, _overrides, _keep) in bench.API_ROWS.items():
        assert preset is None or preset == f"{algo}-{env}", name
        assert steps > 0


def test_weights_digest_sees_one_ulp_dtype_and_shape(bench):
    w = [np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), np.zeros(3, np.float32)]
    same = [x.copy() for x in w]
    assert bench.weights_digest(w) == bench.weights_digest(same)
    ulp = [w[0].copy(), w[1]]
    ulp[0][1, 2] = np.nextafter(ulp[0][1, 2], np.float32(2))
    assert bench.weights_digest(ulp) != bench.weights_digest(w)
    assert bench.weights_digest([w[0].reshape(3, 2), w[1]]) != bench.weights_digest(w)
    as_int = [w[0], w[1].view(np.int32)]  # the same bytes, another dtype
    assert bench.weights_digest(as_int) != bench.weights_digest(w)


def test_history_digest_is_exact_and_stable_on_nan(bench):
    h = [{"steps": 256, "episode_return": float("nan")}, {"steps": 512, "episode_return": 0.1}]
    again = [{"episode_return": float("nan"), "steps": 256}, {"steps": 512, "episode_return": 0.1}]
    assert bench.history_digest(h) == bench.history_digest(again)
    moved = [h[0], {"steps": 512, "episode_return": np.nextafter(0.1, 1.0)}]
    assert bench.history_digest(moved) != bench.history_digest(h)


def test_compare_names_the_rows_that_differ(bench, tmp_path, capsys):
    w = [np.ones((2, 2), np.float32)]
    w_moved = [np.array([[1.0, 1.0], [1.0, 1.25]], np.float32)]
    np.savez(tmp_path / "a.npz", *w)
    np.savez(tmp_path / "b.npz", *w_moved)
    row = {"weights": bench.weights_digest(w), "history": "h"}
    before = {"commit": "old", "rows": {"same": row, "moved": {**row, "weights_file":
                                                              str(tmp_path / "a.npz")}}}
    after = {"commit": "new", "rows": {"same": row, "moved": {
        "weights": bench.weights_digest(w_moved), "history": "h",
        "weights_file": str(tmp_path / "b.npz")}}}
    for name, data in (("before.json", before), ("after.json", after)):
        (tmp_path / name).write_text(json.dumps(data))
    assert bench.compare(str(tmp_path / "before.json"), str(tmp_path / "before.json")) == 0
    capsys.readouterr()
    assert bench.compare(str(tmp_path / "before.json"), str(tmp_path / "after.json")) == 1
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["same"].split()[1:] == ["equal", "equal"]
    assert lines["moved"].split()[1:3] == ["DIFFERENT", "equal"]
    assert "largest |difference| 0.25 (largest |weight| before 1)" in lines["moved"]
