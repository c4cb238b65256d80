"""Smoke test of ``benchmarks/convolutions.py`` (issue 38): tiny shapes, so that a change of
``robustgrad.winograd`` or ``robustgrad.convolution`` breaks here and not in the benchmark."""

from __future__ import annotations

import json

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("convolutions")


def test_quick_run_writes_a_row_per_shape_with_ratios(bench, tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert bench.main(["2x4x8->8", "1x4x128->128", "--repeats", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["shape"] for r in rows] == ["2x4x8->8", "1x4x128->128"]
    assert [r["pays"] for r in rows] == [False, True]  # the measured rule
    for row in rows:
        for kind in ("direct", "winograd2", "winograd4"):
            assert row[kind]["forward_cpu_s"] >= 0 and row[kind]["input_gradient_cpu_s"] >= 0
        ratio = row["winograd4"]["forward_ratio"]
        assert ratio == pytest.approx(row["winograd4"]["forward_cpu_s"]
                                      / max(row["direct"]["forward_cpu_s"], 1e-12))
    assert "1x4x128->128" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["128x32x160", "0x4x8->8", "a x b", "2x4x8->-1"])
def test_bad_shapes_are_refused_naming_the_form(bench, text):
    with pytest.raises(ValueError, match="NxHWxCIN->COUT"):
        bench.parse_shape(text)
