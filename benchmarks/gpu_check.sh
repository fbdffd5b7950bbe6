#!/usr/bin/env bash
# perfkit's GPU paths on a GPU node, in one prepared run of under 8 minutes.
#
#   bash benchmarks/gpu_check.sh [--dry-run] [OUT_DIR]      (OUT_DIR: default $OUT, else ./gpu-check)
#
# Steps, each bounded by `timeout` and run whatever the previous one did:
#   env          perfkit env --json                                   -> env.json
#   peaks        perfkit peaks --json (quick; shape search included)  -> peaks.json
#   gpu_tests    the tests marked `gpu` (CUDA events, nccl, _scaled_mm, CUDA SDPA counting,
#                compile=True on the GPU)                              -> gpu_tests.log
#   train_bf16   the training step in bf16, MFU against the spec row  -> train_bf16.json
#   nccl         one-rank nccl collectives, knobs checked on a live NCCL log -> nccl.json
#   sdpa_count   count_ops of a bf16 scaled_dot_product_attention     -> sdpa_count.json
# Every step's stderr goes to steps.log, the summary to summary.txt (8 files at most in OUT_DIR).
# Without a GPU (torch.cuda.is_available() is False) the GPU-only steps are skipped and say so,
# and the gpu-marked tests skip with their reason: the script's own logic runs on any machine.
# --dry-run prints the plan and runs nothing. Exit 0 when no step failed.
#
# The environment: the node's own torch (CUDA/ROCm), pandas, pyarrow, pytest, used as they are
# and nothing downloaded; perfkit runs from this checkout (PYTHONPATH), no install needed. The
# interpreter is the repo's .venv or python3, whichever has a torch that sees a GPU; without
# either, a `python3 -m venv --system-site-packages .venv` is created. PERFKIT_PYTHON overrides.
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
DEST="${1:-${OUT:-$REPO/gpu-check}}"

# Seconds per step; together 450 s, so the run stays under 8 minutes with the venv's creation.
STEPS=(env peaks gpu_tests train_bf16 nccl sdpa_count)
declare -A LIMIT_S=([env]=30 [peaks]=90 [gpu_tests]=180 [train_bf16]=60 [nccl]=60 [sdpa_count]=30)
declare -A GPU_ONLY=([env]=0 [peaks]=1 [gpu_tests]=0 [train_bf16]=1 [nccl]=1 [sdpa_count]=1)

if [ "$DRY" = 1 ]; then
  echo "gpu_check (dry run): outputs would go to $DEST"
  total=0
  for s in "${STEPS[@]}"; do
    gpu=""; [ "${GPU_ONLY[$s]}" = 1 ] && gpu=" (GPU only: skipped without one)"
    echo "  $s: at most ${LIMIT_S[$s]} s$gpu"
    total=$((total + ${LIMIT_S[$s]}))
  done
  echo "  total at most $total s"
  exit 0
fi

mkdir -p "$DEST" || { echo "gpu_check: cannot create $DEST" >&2; exit 2; }
DEST="$(cd "$DEST" && pwd)"
LOG="$DEST/steps.log"
: >"$LOG"

# The interpreter: the first candidate whose torch sees a GPU, else the first with a torch.
# Not blindly .venv: a venv copied from a CPU machine holds the CPU torch, and where the node's
# python3 is itself a venv (/opt/torch/.venv on some images), `venv --system-site-packages`
# sees the base interpreter's packages, not that venv's torch.
sees() { "$1" -c "import torch, sys; sys.exit(0 if $2 else 1)" 2>/dev/null; }
if [ -n "${PERFKIT_PYTHON:-}" ]; then
  CANDIDATES=("$PERFKIT_PYTHON")
else
  CANDIDATES=("$REPO/.venv/bin/python" "$(command -v python3 || true)")
fi
PY=""
for c in "${CANDIDATES[@]}"; do [ -x "$c" ] && sees "$c" "torch.cuda.is_available()" && { PY="$c"; break; }; done
if [ -z "$PY" ]; then
  for c in "${CANDIDATES[@]}"; do [ -x "$c" ] && sees "$c" True && { PY="$c"; break; }; done
fi
if [ -z "$PY" ] && [ -z "${PERFKIT_PYTHON:-}" ] && [ ! -e .venv ]; then
  echo "gpu_check: creating .venv (python3 -m venv --system-site-packages .venv)"
  python3 -m venv --system-site-packages .venv && sees .venv/bin/python True && PY="$REPO/.venv/bin/python"
fi
[ -n "$PY" ] || { echo "gpu_check: no Python with torch found (tried ${CANDIDATES[*]}); set PERFKIT_PYTHON" >&2; exit 1; }
echo "gpu_check: python $PY"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if sees "$PY" "torch.cuda.is_available()"; then
  HAS_GPU=1
  echo "gpu_check: $("$PY" -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))")"
else
  HAS_GPU=0
  echo "gpu_check: no GPU (torch.cuda.is_available() is False): GPU-only steps are skipped"
fi

# One step's command (stdout is the step's output file).
step_cmd() {
  case "$1" in
    env)        "$PY" -m perfkit.cli env --json ;;
    peaks)      "$PY" -m perfkit.cli peaks --json --device cuda ;;
    gpu_tests)  # only the files holding gpu-marked tests: others may import what this node lacks
                "$PY" -m pytest $(grep -l "pytest.mark.gpu" tests/test_*.py) -m gpu -p no:cacheprovider -q -rs ;;
    train_bf16) "$PY" - <<'EOF'
import json
from perfkit.core.devices import detect
from perfkit.core.specs import spec_ceilings
from perfkit.measuring.training.config import TrainConfig
from perfkit.measuring.training.step import train_step_benchmark

row = train_step_benchmark(TrainConfig(model="transformer", precision="bf16", device="cuda", steps=10,
                                       batch_size=16))
info = detect("cuda")
spec = [r for r in spec_ceilings(info.name, getattr(info, "compute_units", None))
        if r["kind"] == "compute" and r["dtype"] == "bf16"]
keep = ("status", "resolved_device", "device_name", "step_time_s", "step_time_iqr_s", "samples_per_s",
        "tokens_per_s", "model_flop_per_s", "peak_flop_per_s", "peak_source", "mfu", "mfu_convention",
        "mfu_reason", "counted_flop_utilisation", "counted_flop_reason", "peak_mem_bytes", "loss_first", "loss_last")
print(json.dumps({"row": {k: row.get(k) for k in keep}, "spec_bf16_rows": spec}, indent=2, default=str))
EOF
    ;;
    nccl)       "$PY" - <<'EOF'
import json
from perfkit.measuring.collectives.benchmark import CollectivesConfig, run_collectives

cfg = CollectivesConfig(ops=("all_reduce", "all_gather"), world_size=1, backend="nccl", min_bytes=1 << 16,
                        max_bytes=1 << 24, factor=16, iters=10, env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"},
                        timeout_s=55)
rows = run_collectives(cfg)
cols = ["op", "inplace", "size_bytes", "time_s", "busbw_bytes_per_s", "wrong_elements", "knob_check",
        "algo_observed", "proto_observed", "knob_check_detail", "timed_nccl_debug"]
print(json.dumps(rows[[c for c in cols if c in rows]].to_dict(orient="records"), indent=2, default=str))
EOF
    ;;
    sdpa_count) "$PY" - <<'EOF'
import json
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import sdpa_flop_count
from perfkit.measuring.ops.counting import count_ops, coverage

q, k, v = (torch.randn(4, 16, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
df = count_ops(F.scaled_dot_product_attention, q, k, v)
print(json.dumps({"ops": df[["op", "family", "flop", "bytes_read", "bytes_written", "dtype"]].to_dict(orient="records"),
                  "expected_attention_flop": sdpa_flop_count(q.shape, k.shape, v.shape),
                  "uncounted": [u.op for u in coverage(df).uncounted]}, indent=2, default=str))
EOF
    ;;
  esac
}

declare -A OUTFILE=([env]=env.json [peaks]=peaks.json [gpu_tests]=gpu_tests.log [train_bf16]=train_bf16.json
                    [nccl]=nccl.json [sdpa_count]=sdpa_count.json)
declare -A RESULT
failed=0
start_all=$(date +%s)
for s in "${STEPS[@]}"; do
  if [ "${GPU_ONLY[$s]}" = 1 ] && [ "$HAS_GPU" = 0 ]; then
    RESULT[$s]="skipped (no GPU)"
    echo "== $s: skipped (no GPU)"
    continue
  fi
  echo "== $s (at most ${LIMIT_S[$s]} s) -> ${OUTFILE[$s]}"
  echo "== $s" >>"$LOG"
  t0=$(date +%s)
  # step_cmd runs in a subshell under timeout's process group; --kill-after ends a step that
  # ignores SIGTERM (a hung NCCL call).
  export -f step_cmd; export PY
  timeout --kill-after=10 "${LIMIT_S[$s]}" bash -c "step_cmd $s" >"$DEST/${OUTFILE[$s]}" 2>>"$LOG"
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  if [ $rc = 0 ]; then RESULT[$s]="ok (${dt} s)"
  elif [ $rc = 124 ] || [ $rc = 137 ]; then RESULT[$s]="timeout after ${dt} s"; failed=$((failed + 1))
  else RESULT[$s]="failed, exit $rc (${dt} s; see steps.log)"; failed=$((failed + 1))
  fi
  echo "   ${RESULT[$s]}"
  if [ "$s" = gpu_tests ]; then tail -n 15 "$DEST/${OUTFILE[$s]}"; fi
done

{
  echo "gpu_check summary ($(( $(date +%s) - start_all )) s, outputs in $DEST)"
  for s in "${STEPS[@]}"; do printf '  %-11s %s\n' "$s" "${RESULT[$s]}"; done
} | tee "$DEST/summary.txt"
[ $failed = 0 ]
