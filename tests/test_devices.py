"""The spec-sheet table against the reference table, sparsity traps, unknown devices, CPU peak."""

import math
import re
import types

import pytest

from perfkit.core import devices, specs
from perfkit.core.devices import cpu_theoretical_peak
from perfkit.core.specs import SPEC_TABLE, spec_peaks


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
    assert specs.spec_ceilings(name) == []


# ---- exact parts (issue 11, item 12): names as torch reports them ----------------------------

@pytest.mark.parametrize("name", [
    "NVIDIA GH200 480GB",            # Grace Hopper: not an H200 SXM (its GPU has 96 or 144 GB)
    "NVIDIA GH200 144G HBM3e",
    "NVIDIA H200 NVL",               # the PCIe card
    "NVIDIA H800",                   # not in perfkit's table: unknown, not H100's numbers
    "NVIDIA H800 PCIe",
    "NVIDIA H100 64GB HBM2e",        # another memory size than the table's 80 GB part
    "NVIDIA RTX A1000",              # "A100" inside "A1000"
    "NVIDIA A100X",
    "AMD Instinct MI250",            # 104 CUs per GCD, other peaks than MI250X
    "AMD Instinct MI250X / MI250",   # ROCm's shared name: which part, the name cannot say
])
def test_a_name_matches_its_exact_part_or_nothing(name):
    assert spec_peaks(name) is None, spec_peaks(name)
    assert specs.spec_ceilings(name) == []


@pytest.mark.parametrize("name,model", [
    ("NVIDIA H200", "NVIDIA H200 SXM"), ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"), ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM"),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 40GB"), ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe"),
    ("AMD Instinct MI250X", "AMD Instinct MI250X (per GCD)"), ("AMD Instinct MI300X", "AMD Instinct MI300X"),
])
def test_known_parts_still_match(name, model):
    assert spec_peaks(name).model == model


def test_mi250_and_mi250x_told_apart_by_compute_units(reference_dir):
    # ROCm docs, "AMD GPU specifications": MI250X 220 CUs (110 per GCD), MI250 208 (104 per GCD);
    # torch reports the CUs of one GCD (props.multi_processor_count).
    shared = "AMD Instinct MI250X / MI250"
    ref = _reference_rows(reference_dir)["MI250X, per GCD (torch sees each GCD as a device)"]
    mi250x = spec_peaks(shared, compute_units=110)
    assert mi250x is not None and mi250x.flop_per_s["bf16"] == pytest.approx(_first_number(ref[4]))
    assert spec_peaks(shared, compute_units=104) is None                # an MI250
    assert spec_peaks("AMD Instinct MI250X", compute_units=104) is None  # name and count disagree
    assert spec_peaks("AMD Instinct MI250X", compute_units=110) is mi250x
    assert "110 CUs per GCD" in mi250x.source


def test_reference_lookups_use_the_device_compute_units():
    from perfkit.analyse import mfu

    def info(units):
        return devices.DeviceInfo(kind="rocm", torch_device="cuda:0", name="AMD Instinct MI250X / MI250",
                                  count=8, memory_bytes=64 * 2**30, capability="gfx90a", compute_units=units)

    assert devices.reference_ceilings(info(104)) == []
    assert any(r["dtype"] == "bf16" and r["value"] == pytest.approx(191.5e12)
               for r in devices.reference_ceilings(info(110)))
    mi250 = mfu.peak_flop_per_s(device_kind="rocm", device_name="AMD Instinct MI250X / MI250",
                                precision="bf16", devices=8, compute_units=104)
    assert math.isnan(mi250.flop_per_s) and "unknown device" in mi250.reason


def test_detect_reads_the_compute_units(monkeypatch):
    import torch

    props = types.SimpleNamespace(major=9, minor=0, total_memory=80 * 2**30, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)
    info = devices.detect("cuda:0")
    assert (info.kind, info.name, info.compute_units) == ("cuda", "NVIDIA H200", 132)


def test_nvlink_figures_belong_to_their_part():
    from perfkit.core.specs import spec_link

    assert spec_link("NVIDIA H100 80GB HBM3")[0] == 450e9 and spec_link("NVIDIA H200")[0] == 450e9
    h800, source = spec_link("NVIDIA H800")
    assert h800 == 200e9 and "400 GB/s" in source  # 400 GB/s bidirectional, not H100's 900
    for name in ("NVIDIA GH200 480GB", "NVIDIA H800 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL",
                 "NVIDIA A100-PCIE-40GB", "NVIDIA RTX A1000"):
        assert math.isnan(spec_link(name)[0]), name


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


# Which spec peak an MFU of each training precision divides by, per device: the peak of the
# units its GEMMs run on. fp32 GEMMs on CDNA2/CDNA3 run on the matrix cores (MFMA: rocBLAS and
# hipBLASLt sgemm), so fp32 MFU there uses the matrix fp32 figure of peaks.md; on NVIDIA, IEEE
# fp32 runs on the CUDA cores (the fp32 figure) and tf32 on the tensor cores.
@pytest.mark.parametrize("name, units, precision, key", [
    ("AMD Instinct MI250X", 110, "fp32", "fp32_matrix"),
    ("AMD Instinct MI250X / MI250", 110, "fp32", "fp32_matrix"),
    ("AMD Instinct MI300X", None, "fp32", "fp32_matrix"),
    ("AMD Instinct MI250X", 110, "bf16", "bf16"),
    ("AMD Instinct MI300X", None, "fp8", "fp8"),
    ("NVIDIA H100 80GB HBM3", None, "fp32", "fp32"),
    ("NVIDIA H100 80GB HBM3", None, "tf32", "tf32"),
    ("NVIDIA A100-SXM4-80GB", None, "bf16-pure", "bf16"),
])
def test_mfu_divides_by_the_peak_of_the_units_the_gemms_run_on(name, units, precision, key):
    from perfkit.analyse import mfu

    row = spec_peaks(name, compute_units=units)
    assert row.mfu_peak_key(precision) == key
    peak = mfu.peak_flop_per_s(device_kind="rocm" if "AMD" in name else "cuda", device_name=name,
                               precision=precision, devices=2, compute_units=units)
    assert peak.flop_per_s == pytest.approx(2 * row.flop_per_s[key]) and peak.reason is None
    assert f"spec dense {key} peak" in peak.description


def test_amd_fp32_mfu_is_of_the_matrix_peak_the_spec_sheet_gives(reference_dir):
    ref = _reference_rows(reference_dir)
    mi250x = next(cells for title, cells in ref.items() if title.startswith("MI250X"))
    matrix = float(re.search(r"\(([\d.]+) matrix\)", mi250x[2]).group(1)) * 1e12  # 47.9
    from perfkit.analyse import mfu

    peak = mfu.peak_flop_per_s(device_kind="rocm", device_name="AMD Instinct MI250X", precision="fp32",
                               devices=1, compute_units=110)
    assert peak.flop_per_s == pytest.approx(matrix)  # not the 23.9 vector figure
    mi300x = mfu.peak_flop_per_s(device_kind="rocm", device_name="AMD Instinct MI300X",
                                 precision="fp32", devices=1)
    assert mi300x.flop_per_s == pytest.approx(163.4e12)  # was NaN: only the matrix figure is known
