"""The precision policy: one meaning of each precision for torch's math flags, on every device.

The flags are process-global and settable on a CPU build, so the policy is tested here through
the same code that runs on a GPU; ROCm's conditions are tested on fake arch names and a fake
``torch.version.hip``."""

import os

import pytest
import torch

from perfkit.core import precision
from perfkit.core.errors import ConfigurationSkipped


def _flags() -> dict:
    """What torch reports now: the legacy flags and, on torch >= 2.9, the per-op ones."""
    flags = {"matmul_precision": torch.get_float32_matmul_precision(),
             "cublas_tf32": torch.backends.cuda.matmul.allow_tf32,
             "cudnn_tf32": torch.backends.cudnn.allow_tf32}
    if hasattr(torch.backends.cudnn, "conv"):
        flags.update(matmul=torch.backends.cuda.matmul.fp32_precision,
                     conv=torch.backends.cudnn.conv.fp32_precision,
                     rnn=torch.backends.cudnn.rnn.fp32_precision,
                     onednn_matmul=torch.backends.mkldnn.matmul.fp32_precision)
    return flags


@pytest.fixture
def tf32_everywhere():
    """A user who turned TF32 on for matmuls and cuDNN (cuDNN's own default is on)."""
    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    yield _flags()
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32 = saved[1]


@pytest.mark.parametrize("name", ["fp32", "fp64", "bf16", "fp16", "bf16-pure", "fp8"])
def test_every_non_tf32_precision_turns_tf32_off_and_restores(tf32_everywhere, name):
    with precision.math_mode(name):
        inside = _flags()
    assert inside["matmul_precision"] == "highest"
    assert inside["cublas_tf32"] is False and inside["cudnn_tf32"] is False
    if "conv" in inside:  # explicit IEEE, not "none" (which inherits a global tf32 setting)
        assert {inside[k] for k in ("matmul", "conv", "rnn", "onednn_matmul")} == {"ieee"}
    assert _flags() == tf32_everywhere


def test_tf32_turns_matmul_and_cudnn_tf32_on_and_restores():
    before = _flags()
    torch.backends.cudnn.allow_tf32 = False
    try:
        with precision.math_mode("tf32"):
            inside = _flags()
    finally:
        torch.backends.cudnn.allow_tf32 = before["cudnn_tf32"]
    assert inside["matmul_precision"] == "high"
    assert inside["cublas_tf32"] is True and inside["cudnn_tf32"] is True
    if "conv" in inside:
        assert inside["conv"] == inside["rnn"] == inside["matmul"] == "tf32"
        assert inside["onednn_matmul"] == "ieee"  # oneDNN's bf16 mode is not tf32 either
    assert _flags() == before


def test_flags_are_restored_when_the_block_raises(tf32_everywhere):
    with pytest.raises(RuntimeError, match="boom"), precision.math_mode("fp32"):
        raise RuntimeError("boom")
    assert _flags() == tf32_everywhere


def test_roofline_step_in_fp32_runs_convolutions_without_tf32(tf32_everywhere):
    """The roofline step used to leave cuDNN's TF32 on: an fp32 conv point above the fp32 roof."""
    from perfkit.measuring.ops import roofline_step
    from perfkit.measuring.workloads import synthetic as workloads

    spec = workloads.make_spec("convnet", image_size=8, widths=(4, 8), n_classes=3)
    work = workloads.build(spec)
    seen = []
    work.model.register_forward_pre_hook(lambda module, args: seen.append(_flags()))
    roofline_step.profile_step(work, 2, dtype=torch.float32, profile_steps=1,
                               min_run_time_s=0.01)
    assert seen
    assert all(f["cudnn_tf32"] is False and f["cublas_tf32"] is False for f in seen)
    assert all(f["matmul_precision"] == "highest" for f in seen)
    assert _flags() == tf32_everywhere


def test_gemm_fp32_runs_ieee_and_restores(tf32_everywhere, monkeypatch):
    from perfkit.measuring.kernels import gemm

    seen = []
    real_matmul = torch.matmul

    def spy(*args, **kwargs):
        seen.append(_flags())
        return real_matmul(*args, **kwargs)

    monkeypatch.setattr(torch, "matmul", spy)
    rows = gemm.measure_gemm([16], ["fp32"], device="cpu", min_run_time_s=0.01)
    assert rows[0]["status"] == "ok" and seen
    assert all(f["cudnn_tf32"] is False and f["cublas_tf32"] is False for f in seen)
    assert _flags() == tf32_everywhere


# ---- ROCm -------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch, dtype", [
    ("gfx942:sramecc+:xnack-", torch.float8_e4m3fnuz),  # MI300X/MI325X: fnuz
    ("gfx940", torch.float8_e4m3fnuz),
    ("gfx950:sramecc+:xnack-", torch.float8_e4m3fn),  # MI350/MI355: OCP
    ("gfx1201", torch.float8_e4m3fn),  # RDNA4: OCP
    ("gfx90a:sramecc+:xnack-", None),  # MI200: no fp8
    ("gfx1100", None),
    (None, torch.float8_e4m3fn),  # NVIDIA: OCP
])
def test_fp8_dtype_follows_the_arch(arch, dtype):
    assert precision.fp8_e4m3_dtype(arch) == dtype
    if arch is not None:
        reason = precision.fp8_reason(arch)
        assert (reason is None) == (dtype is not None)
        if reason:
            assert arch in reason


@pytest.mark.parametrize("arch, version, ok", [
    ("gfx942:sramecc+:xnack-", "2.7.1+rocm6.3", True),
    ("gfx950", "2.9.0+rocm7.0", True),
    ("gfx942", "2.6.0+rocm6.2", False),  # before pytorch#143549: allow_tf32 ignored on ROCm
    ("gfx90a", "2.8.0+rocm6.4", False),  # MI200: no xf32
])
def test_rocm_tf32_needs_torch_2_7_and_mi300(arch, version, ok):
    reason = precision.rocm_tf32_reason(arch, version)
    assert (reason is None) == ok
    if not ok:
        assert ("2.7" in reason) or (arch in reason)


@pytest.fixture
def fake_rocm(monkeypatch):
    """torch as a ROCm build would present itself (HIP version set) on an MI300X."""
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.delenv(precision.ROCM_TF32_ENV, raising=False)
    props = type("Props", (), {"gcnArchName": "gfx942:sramecc+:xnack-", "major": 9, "minor": 4})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    return props


def test_rocm_tf32_sets_hipblaslt_allow_tf32_for_the_block(fake_rocm):
    with precision.math_mode("tf32"):
        assert os.environ[precision.ROCM_TF32_ENV] == "1"
        assert torch.backends.cuda.matmul.allow_tf32 is True
    assert precision.ROCM_TF32_ENV not in os.environ
    with precision.math_mode("fp32"):  # fp32 leaves the gate alone
        assert precision.ROCM_TF32_ENV not in os.environ


def test_rocm_tf32_is_skipped_with_the_reason_when_torch_keeps_it_off(fake_rocm, monkeypatch):
    # A build that read the variable once at start-up keeps reporting TF32 off.
    monkeypatch.setattr(precision, "_cublas_tf32_on", lambda: False)
    before = _flags()
    with pytest.raises(ConfigurationSkipped, match="HIPBLASLT_ALLOW_TF32=1"), \
            precision.math_mode("tf32"):
        pass
    assert _flags() == before and precision.ROCM_TF32_ENV not in os.environ


def test_rocm_support_in_gemm_and_ceilings(fake_rocm, monkeypatch):
    """MI300X honours tf32 (it was refused as "NVIDIA only"); MI200 gets the reason."""
    from perfkit.measuring.kernels import ceilings
    from perfkit.measuring.kernels import gemm

    assert gemm.dtype_support("tf32", "cuda:0") is None
    assert ceilings.compute_dtypes("cuda:0")["tf32"] is None
    assert ceilings.compute_dtypes("cuda:0")["fp8"] is None
    fake_rocm.gcnArchName = "gfx90a:sramecc+:xnack-"
    assert "gfx90a" in gemm.dtype_support("tf32", "cuda:0")
    assert "gfx90a" in ceilings.compute_dtypes("cuda:0")["fp8"]
    monkeypatch.setattr(torch, "__version__", "2.6.0+rocm6.2")
    fake_rocm.gcnArchName = "gfx942"
    assert "2.7" in gemm.dtype_support("tf32", "cuda:0")
    assert "2.7" in ceilings.compute_dtypes("cuda:0")["tf32"]


@pytest.mark.parametrize("arch, dtype", [("gfx950:sramecc+:xnack-", torch.float8_e4m3fn),
                                         ("gfx942:sramecc+:xnack-", torch.float8_e4m3fnuz)])
def test_fp8_ceiling_uses_the_devices_e4m3_variant(fake_rocm, monkeypatch, arch, dtype):
    from perfkit.measuring.kernels import ceilings

    fake_rocm.gcnArchName = arch
    seen = []
    monkeypatch.setattr(torch, "_scaled_mm", lambda a, b, **kw: seen.append((a.dtype, b.dtype)))
    ceilings._matmul_fn("cpu", "fp8", 16, 16, 16)()  # operands built as on the GPU, on the CPU
    assert seen == [(dtype, dtype)]


def test_an_unknown_precision_is_bad_input():
    from perfkit.core.errors import BadInputError

    with pytest.raises(BadInputError, match="fp9"), precision.math_mode("fp9"):
        pass


def test_the_h200_fp8_rows_are_told_why_fp8_is_slower_than_bf16():
    # Issue 43: fp8 ran 3.2x (batch 128) and 5.5x (batch 32) slower than bf16 on the H200, eager and
    # with d_model 1024: the rows now say why, from torchao's own guidance.
    import json

    import pandas as pd

    from conftest import REFERENCE
    from perfkit.measuring.training.config import TrainConfig
    from perfkit.measuring.training.fp8_notes import fp8_columns, worth_converting

    folder = REFERENCE / "gpu-h200" / "results"
    if not folder.exists():
        pytest.skip(f"{folder} is absent (the shared H200 reference data)")
    rows = pd.concat([pd.read_parquet(p) for p in sorted(folder.glob("train_step-*.parquet"))])
    fp8 = rows[rows["precision"] == "fp8"]
    assert len(fp8) == 2
    for row in fp8.itertuples():
        cfg = TrainConfig(model=row.model, model_size=json.loads(row.model_size), precision="fp8",
                          batch_size=int(row.batch_size), seq_len=int(row.seq_len), compile=bool(row.compile))
        got = fp8_columns(cfg)
        # 4 blocks of q, k, v, out (1024x1024) and fc1 (4096x1024) below; fc2 (1024x4096) and the lm head (8192x1024) pay.
        assert (got["fp8_linears"], got["fp8_linears_below_threshold"]) == (25, 20), got
        assert "eager" in got["fp8_reason"] and "compile=True" in got["fp8_reason"]
        assert "1024x1024, 4096x1024" in got["fp8_reason"]
        compiled = fp8_columns(TrainConfig(**{**cfg.as_dict(), "compile": True}))
        assert "eager" not in compiled["fp8_reason"] and compiled["fp8_linears_below_threshold"] == 20
    assert fp8_columns(TrainConfig(model="transformer", precision="bf16")) == {}
    # torchao's tensorwise filter: skip when out_features <= 4096 and in_features <= 1024.
    assert not worth_converting(4096, 1024) and worth_converting(4097, 1024) and worth_converting(1024, 1025)
