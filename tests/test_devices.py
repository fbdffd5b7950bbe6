"""The spec-sheet table against the reference table, sparsity traps, unknown devices, CPU peak."""

import re

import pytest

from perfkit import devices
from perfkit.devices import SPEC_TABLE, cpu_theoretical_peak, spec_peaks


def test_every_entry_has_a_source_and_positive_values():
    for row in SPEC_TABLE:
        assert row.source.strip(), row.model
        assert all(v > 0 for v in row.flop_per_s.values()), row.model
        assert row.memory_bytes_per_s is None or row.memory_bytes_per_s > 0


def _reference_rows(reference_dir):
    text = (reference_dir / "peaks.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and re.match(r"^(A100|H100|H200|MI250X|MI300X)", cells[0]):
            rows[cells[0]] = cells
    return rows


def _first_number(cell):
    m = re.match(r"^([\d.]+)", cell)
    return float(m.group(1)) * 1e12 if m else None


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM5"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"), ("AMD Instinct MI250X", "MI250X, per GCD"),
    ("AMD Instinct MI300X", "MI300X"),
])
def test_table_matches_reference(reference_dir, name, key):
    ref = next(cells for title, cells in _reference_rows(reference_dir).items() if title.startswith(key))
    ours = spec_peaks(name)
    assert ours is not None
    # Columns: device | FP64 | FP32 | TF32 | BF16/FP16 | FP8 | HBM TB/s | memory | source
    for col, dtype in ((1, "fp64"), (2, "fp32"), (3, "tf32"), (4, "bf16"), (5, "fp8")):
        expected = _first_number(ref[col])
        if "matrix" in ref[col] and dtype == "fp32" and not re.match(r"^[\d.]+ \(", ref[col]):
            dtype = "fp32_matrix"  # MI300X lists only the matrix FP32 figure
        assert ours.flop_per_s.get(dtype) == (pytest.approx(expected) if expected else None), (key, dtype)
    assert ours.memory_bytes_per_s == (pytest.approx(_first_number(ref[6])) if _first_number(ref[6]) else None)


def test_no_entry_uses_sparse_figures():
    # Dense tensor-core throughput doubles with each halving of precision on these parts
    # (TF32 → BF16 → FP8). A sparse figure slipped into one column breaks the ratio by 2x.
    for row in SPEC_TABLE:
        f = row.flop_per_s
        if "tf32" in f and "bf16" in f:
            assert f["bf16"] / f["tf32"] == pytest.approx(2.0, rel=0.01), row.model
        if "bf16" in f and "fp8" in f:
            assert f["fp8"] / f["bf16"] == pytest.approx(2.0, rel=0.01), row.model
    # And the well-known sparse numbers themselves are absent.
    sparse = {1979e12, 3958e12, 624e12, 1513e12 * 2, 2 * 1307.4e12}
    for row in SPEC_TABLE:
        for dtype, v in row.flop_per_s.items():
            assert all(abs(v - s) > 1e9 for s in sparse if dtype in ("bf16", "fp16")), (row.model, dtype)


def test_mi250x_is_per_gcd():
    assert spec_peaks("AMD Instinct MI250X").flop_per_s["bf16"] == pytest.approx(191.5e12)


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090", "NVIDIA H100 NVL", "Tesla V100-SXM2-16GB",
                                  "AMD Instinct MI210", "Intel(R) Xeon(R) Processor"])
def test_unknown_devices_are_unknown(name):
    assert spec_peaks(name) is None
    assert devices.spec_ceilings(name) == []


def test_variants_do_not_inherit_the_generic_numbers():
    assert spec_peaks("NVIDIA H100 PCIe").flop_per_s.get("tf32") is None  # blank in the table
    assert spec_peaks("NVIDIA A100-SXM4-40GB").memory_bytes_per_s == pytest.approx(1.555e12)
    assert spec_peaks("NVIDIA A100 80GB PCIe").memory_bytes_per_s is None


def test_cpu_theoretical_peak_formula():
    # AVX-512, 2 FMA units: 2 x 16 lanes x 2 FLOP = 64 FP32 FLOP/cycle; x 2 cores x 2.1 GHz.
    peak = cpu_theoretical_peak(flags={"avx512f", "avx2", "fma"}, cores=2, clock_hz=2.1e9)
    assert peak.flop_per_cycle_per_core == {"fp32": 64, "fp64": 32}
    assert peak.flop_per_s["fp32"] == pytest.approx(2 * 2.1e9 * 64)
    avx2 = cpu_theoretical_peak(flags={"avx2", "fma"}, cores=4, clock_hz=3e9)
    assert avx2.flop_per_s["fp32"] == pytest.approx(4 * 3e9 * 32)
    assert "assumed" in peak.assumption


def test_detect_cpu():
    info = devices.detect("cpu")
    assert info.kind == "cpu" and info.count >= 1 and info.name
    refs = devices.reference_ceilings(info)
    assert {r["origin"] for r in refs} == {"theoretical"}
    assert all(r["value"] > 0 for r in refs)
