"""A row's fingerprint describes the device that row measured, and the report draws a device's
peaks only over its own rows (issue 11, item 11).

The GPU node is faked: torch.cuda says one "NVIDIA H100 80GB HBM3" is visible (the same calls
perfkit.core.devices.detect makes on a real node); everything else runs on this CPU.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from conftest import ceiling_row
from perfkit.core import env
from perfkit.core.devices import cpu_model_name
from perfkit.core.specs import spec_peaks
from perfkit.view.plots._common import hv_bokeh
from perfkit.core.results import record

H100 = "NVIDIA H100 80GB HBM3"
H100_FP32 = spec_peaks(H100).flop_per_s["fp32"]
hv = hv_bokeh()


@pytest.fixture
def gpu_node(monkeypatch):
    props = SimpleNamespace(name=H100, major=9, minor=0, total_memory=80 * 2**30,
                            multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: H100)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)
    env._static.cache_clear()  # the fingerprint caches per device: drop what the real node gave
    yield
    env._static.cache_clear()


def test_a_cpu_row_on_a_gpu_node_carries_the_cpu(gpu_node, run_context):
    rows = record([
        {"workload": "gemm", "device": "cpu", "flop_per_s": 1e9},            # asked for the CPU
        {"workload": "train_step", "device": "auto", "resolved_device": "cpu"},  # auto resolved
        {"workload": "gemm", "device": "cuda:0", "flop_per_s": 1e14},        # the GPU
        {"workload": "note"},                                                # says nothing: auto
    ])
    kinds = rows["env_device_kind"].tolist()
    assert kinds == ["cpu", "cpu", "cuda", "cuda"]
    assert rows["env_device_name"].tolist()[:3] == [cpu_model_name(), cpu_model_name(), H100]
    assert rows["env_device_compute_units"].tolist()[2] == 132
    cpu_facts = json.loads(rows["env_json"].iloc[0])
    assert cpu_facts["device"] == "cpu" and cpu_facts["driver"] is None
    assert cpu_facts["cpu_threads"] == torch.get_num_threads() and cpu_facts["cpu_cores_counted"] >= 1
    # Same software, different devices: different fingerprints.
    assert rows["env_fingerprint_id"].iloc[0] != rows["env_fingerprint_id"].iloc[2]


def test_a_gpu_row_on_a_machine_without_one_is_described_by_what_it_has(run_context):
    # e.g. a skipped "tf32 needs an NVIDIA GPU" row recorded on this CPU machine
    rows = record([{"workload": "gemm", "device": "cuda"}], status="skipped", reason="no GPU")
    assert rows["env_device_kind"].iloc[0] == "cpu"


# ---- the report: peaks drawn only over their own device's rows -----------------------------------

def _env(kind: str, name: str) -> dict:
    """Fingerprint columns as rows recorded on the GPU node before fingerprints followed the row's
    device carried them: the node's GPU, whatever the row measured."""
    return {"env_device_kind": kind, "env_device_name": name, "env_cpu_model": cpu_model_name(),
            "env_cpu_cores_counted": 2, "env_fingerprint_id": "fp", "env_json": "{}",
            "env_torch": torch.__version__}


def _gemm_rows(device: str, config: str, flop_per_s: float) -> list[dict]:
    return [{"config_id": config, "workload": "gemm", "status": "ok", "device": device,
             "size": size, "dtype": "fp32", "flop_per_s": flop_per_s * size / 256,
             "time_s": 1e-3, "time_iqr_s": 1e-5, "noisy": False, **_env("cuda", H100)}
            for size in (64, 128, 256)]


def _hlines(obj) -> list[float]:
    return [float(e.data) for e in obj.traverse(lambda e: e, [hv.HLine])]


def _texts(obj) -> list[str]:
    return [e.text for e in obj.traverse(lambda e: e, [hv.Text])]


def test_report_draws_no_gpu_peak_over_cpu_gemm_rows():
    from perfkit.view.report import sections

    df = pd.DataFrame(_gemm_rows("cpu", "cpu-cfg", 5e10))
    (title, obj), = [s for s in sections(df) if s[0] == "GEMM throughput"]
    assert H100_FP32 not in _hlines(obj) and not any("spec" in t for t in _texts(obj))
    assert any("theoretical" in t for t in _texts(obj))  # this CPU's own roof instead


def test_report_splits_gemm_by_device_each_under_its_own_peaks():
    from perfkit.view.report import sections

    df = pd.DataFrame(_gemm_rows("cpu", "cpu-cfg", 5e10) + _gemm_rows("cuda:0", "gpu-cfg", 5e13))
    (title, obj), = [s for s in sections(df) if s[0] == "GEMM throughput"]
    panels = list(obj)
    assert len(panels) == 2
    cpu_panel = next(p for p in panels if "CPU" in p.opts.get().kwargs["title"])
    gpu_panel = next(p for p in panels if H100 in p.opts.get().kwargs["title"])
    assert not any("spec" in t for t in _texts(cpu_panel))
    assert any("spec" in t for t in _texts(gpu_panel))


def _roofline_rows(device: str, config: str, kind: str, name: str) -> list[dict]:
    base = {"config_id": config, "workload": "roofline", "status": "ok", "model": "mlp",
            "device": device, "dtype": "float32", "ceiling_dtype": "fp32", **_env(kind, name)}
    return [{**base, "op": "aten.mm.default", "family": "matmul", "flop": 1e9, "bytes": 1e7,
             "intensity_flop_per_byte": 100.0, "flop_per_s": 5e10, "time_s": 0.02},
            {**base, "op": "aten.add.Tensor", "family": "elementwise", "flop": 1e6, "bytes": 1e7,
             "intensity_flop_per_byte": 0.1, "flop_per_s": 1e9, "time_s": 1e-2}]


def _ceilings(device: str, config: str, kind: str, name: str, rows: list[dict]) -> list[dict]:
    return [{**r, "config_id": config, "workload": "ceiling", "status": "ok", "device": device,
             **_env(kind, name)} for r in rows]


def test_roofline_draws_no_gpu_roof_over_cpu_points():
    from perfkit.view.plots.roofline import roofline_section

    cpu_roofs = [ceiling_row("compute", "fp32", None, 2e11, origin="theoretical"),
                 ceiling_row("memory", None, "DRAM", 2e10)]
    gpu_roofs = [ceiling_row("compute", "fp32", None, H100_FP32, origin="spec"),
                 ceiling_row("memory", None, "HBM", 3.35e12, origin="spec")]
    # The same model swept over device on a GPU node, fingerprints as they were recorded before
    # (the node's GPU on every row): the rows' own device columns tell them apart.
    rows = pd.DataFrame(_roofline_rows("cpu", "cpu-cfg", "cuda", H100)
                        + _roofline_rows("cuda:0", "gpu-cfg", "cuda", H100))
    ceilings = pd.DataFrame(_ceilings("cpu", "cpu-cfg", "cuda", H100, cpu_roofs)
                            + _ceilings("cuda:0", "gpu-cfg", "cuda", H100, gpu_roofs))
    layout = roofline_section(rows, pd.concat([rows, ceilings], ignore_index=True))
    panels = list(layout)
    assert len(panels) == 2
    titles = [p.opts.get().kwargs["title"] for p in panels]
    cpu_panel = panels[next(i for i, t in enumerate(titles) if " on cpu" in t)]
    gpu_panel = panels[next(i for i, t in enumerate(titles) if " on cuda" in t)]

    def roofs(panel):
        return {c.label for c in panel if isinstance(c, hv.Curve) and c.group == "Ceiling"}

    assert not any("spec" in label for label in roofs(cpu_panel)), roofs(cpu_panel)
    assert any("theoretical" in label for label in roofs(cpu_panel))
    assert not any("theoretical" in label for label in roofs(gpu_panel))
    assert any("spec" in label for label in roofs(gpu_panel))


def test_a_model_library_version_is_the_package_own_string_with_its_build_tag(tmp_path, monkeypatch):
    # Issue 43: on the H200 the row said torchvision '0.26.0' (its metadata) where torchvision and
    # the fingerprint said '0.26.0+cu130'. Read without importing it (a CUDA torchvision does not
    # import beside a CPU torch): a package whose metadata lacks the local build tag.
    from perfkit.core import env

    pkg = tmp_path / "fakevision"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (pkg / "version.py").write_text("__version__ = '0.26.0+cu130'\ngit_version = 'abc'\n")
    meta = tmp_path / "fakevision-0.26.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: fakevision\nVersion: 0.26.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert env.library_version("fakevision") == "0.26.0+cu130"
    (pkg / "version.py").unlink()  # no version file: the metadata's
    assert env.library_version("fakevision") == "0.26.0"
    assert env.library_version("no_such_package_here") is None
