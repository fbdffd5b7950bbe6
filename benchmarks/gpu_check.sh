#!/usr/bin/env bash
# perfkit's GPU paths on a GPU node, in one prepared run of under 8 minutes (second version:
# every figure of the GPU trust issue, 43, whose H200 "before" is ../shared/reference/gpu-h200/).
#
#   bash benchmarks/gpu_check.sh [--dry-run] [--wheels DIR] [OUT_DIR]   (OUT_DIR: default $OUT, else ./gpu-check)
#
# Steps, each bounded by `timeout` and run whatever the previous one did:
#   env        perfkit env --json                                             -> env.json
#   ceiling    the quick bf16 ceiling (its shapes tried) beside a plain a @ b
#              sweep of 4096-16384, same process (H200 before: 0.87)          -> ceiling.json
#   gpu_tests  the tests marked `gpu`                                         -> gpu_tests.log
#   probes     JSON lines, one per probe as it ends: the isolated OOM-edge search
#              beside both predictions (H200 before: 1920 measured and fake, 2816
#              analytic); bf16 and fp8, eager and compiled (fp8_reason); the SDPA count -> probes.jsonl
#   nccl       one-rank nccl collectives, knobs checked on a live NCCL log    -> nccl.json
#   sweep      a small sweep through papermill (GEMM, roofline, training with a trace, the kernels
#              notebook (RMSNorm eager, Triton, a wrong variant: no compile, within the budget),
#              hf:llama inference), its report, advice and per-configuration walls
#              (its ledger), packed; its device-busy share (view cells overlapped, the
#              GPU default) goes into the summary. H200 before (issue 45): 16 configurations
#              took 235 s of sweep wall for under 30 s of GPU work; perfkit predict on
#              its trace: the replay error of every traced step (goal 5 %)  -> sweep.tar.gz
# Every step's stderr goes to steps.log, the summary to summary.txt: 8 files at most in OUT_DIR.
# Without a GPU (torch.cuda.is_available() is False) the GPU-only steps are skipped and say so,
# and the gpu-marked tests skip with their reason: the script's own logic runs on any machine.
# --dry-run prints the plan and runs nothing. Exit 0 when no step failed, 2 on bad arguments.
#
# The environment: the node's own torch (CUDA/ROCm), pandas, pyarrow, pytest, used as they are
# and nothing downloaded; perfkit runs from this checkout (PYTHONPATH), no install needed. The
# interpreter is the repo's .venv or python3, whichever has a torch that sees a GPU; without
# either, a `python3 -m venv --system-site-packages .venv` is created. PERFKIT_PYTHON overrides.
# A node without the notebooks' packages (papermill, holoviews, ...) and without a network takes
# them as wheels: --wheels DIR installs DIR/*.whl with `pip install --no-index --no-deps --target`
# into a folder of its own, put on PYTHONPATH after the checkout. benchmarks/gpu_wheels.sh fills
# DIR on a machine with a package index, for the node's Python version and platform.
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"

DRY=0
WHEELS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --wheels) [ -n "${2:-}" ] || { echo "gpu_check: --wheels needs a folder of .whl files" >&2; exit 2; }
              WHEELS="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | grep -v '^set -u' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
DEST="${1:-${OUT:-$REPO/gpu-check}}"
if [ -n "$WHEELS" ] && ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  echo "gpu_check: --wheels $WHEELS holds no .whl files (fill it with benchmarks/gpu_wheels.sh)" >&2
  exit 2
fi

# Seconds per step; together 460 s, and installing --wheels ~30 s on a 16-core node (45 s for 70
# wheels on 2 cores): under 8 minutes in all (the H200 took 128 s for the
# first version's steps, 66 s for the isolated OOM search, 91 s for bf16/fp8 eager and compiled).
STEPS=(env ceiling gpu_tests probes nccl sweep)
declare -A LIMIT_S=([env]=20 [ceiling]=40 [gpu_tests]=85 [probes]=180 [nccl]=30 [sweep]=105)
declare -A GPU_ONLY=([env]=0 [ceiling]=1 [gpu_tests]=0 [probes]=1 [nccl]=1 [sweep]=1)

if [ "$DRY" = 1 ]; then
  echo "gpu_check (dry run): outputs would go to $DEST"
  if [ -n "$WHEELS" ]; then
    echo "  wheels: $(ls "$WHEELS"/*.whl | wc -l) from $WHEELS, installed first (--no-index --no-deps --target)"
  fi
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

WHEEL_NOTE="none given"
if [ -n "$WHEELS" ]; then
  SITE="$(mktemp -d "${TMPDIR:-/tmp}/perfkit-gpu-check-site.XXXXXX")"
  trap 'rm -rf "$SITE"' EXIT
  n=$(ls "$WHEELS"/*.whl | wc -l)
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
      "$WHEELS"/*.whl >>"$LOG" 2>&1; then
    export PYTHONPATH="$PYTHONPATH:$SITE"
    WHEEL_NOTE="$n installed from $WHEELS"
  else
    WHEEL_NOTE="installing $n from $WHEELS failed (see steps.log)"
  fi
  echo "gpu_check: wheels: $WHEEL_NOTE"
fi
# What the sweep needs beside torch, said in the summary whichever way it went.
DEPS_NOTE="$("$PY" -c "
import importlib
out = []
for name in ('papermill', 'holoviews', 'bokeh', 'ipykernel', 'transformers'):
    try:
        out.append(name + ' ' + importlib.import_module(name).__version__)
    except Exception as error:
        out.append(name + ' missing (' + type(error).__name__ + ')')
print(', '.join(out))" 2>>"$LOG")"
echo "gpu_check: $DEPS_NOTE"

if sees "$PY" "torch.cuda.is_available()"; then
  HAS_GPU=1
  echo "gpu_check: $("$PY" -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))")"
else
  HAS_GPU=0
  echo "gpu_check: no GPU (torch.cuda.is_available() is False): GPU-only steps are skipped"
fi

# perfkit predict on the sweep's own GPU trace (issue 48): every traced step replayed from its
# graph (the "REPLAY:" line: the worst |error| of any rank), then DDP and ZeRO-3 at 8 and 64 ranks
# on the reference H100 table where shared/ is beside or inside the checkout.
replay_check() {
  local dir="$1" net=""
  for n in "$REPO/../shared" "$REPO/shared"; do
    [ -f "$n/reference/native/nccl-tests-nccl2.21.5-h100-2node-16rank-allreduce.txt" ] &&
      net="$n/reference/native/nccl-tests-nccl2.21.5-h100-2node-16rank-allreduce.txt" && break
  done
  if [ -z "$net" ]; then
    echo "REPLAY: not run (no shared/reference/native/ beside or inside the checkout for --network)"
    return 0
  fi
  "$PY" -m perfkit.cli predict "$dir" --network "$net" --world-sizes 8,64 >"$dir/predict.txt" 2>&1 ||
    { echo "REPLAY: perfkit predict failed: $(tail -n 1 "$dir/predict.txt")"; return 0; }
  grep -o 'worst replay error [-+0-9.]* %' "$dir/predict.txt" |
    awk '{v = $4 + 0; if (v < 0) v = -v; if (v > m) m = v; n++}
         END {if (n) printf "REPLAY: %d traced rank(s) replayed, worst |error| %.2f %% (goal 5 %%)\n", n, m;
              else print "REPLAY: no traced step in the sweep"}'
}

# One step's command (stdout is the step's output file).
step_cmd() {
  case "$1" in
    env)        "$PY" -m perfkit.cli env --json ;;
    ceiling)    "$PY" benchmarks/gpu_probes.py ceiling ;;
    gpu_tests)  # only the files holding gpu-marked tests: others may import what this node lacks
                "$PY" -m pytest $(grep -l "pytest.mark.gpu" tests/test_*.py) -m gpu -p no:cacheprovider -q -rs ;;
    probes)     "$PY" benchmarks/gpu_probes.py probes ;;
    nccl)       "$PY" benchmarks/gpu_probes.py nccl ;;
    sweep)      # the sweep's folder goes back packed, as one file
                local work rc
                work="$(mktemp -d "${TMPDIR:-/tmp}/perfkit-gpu-sweep.XXXXXX")"
                "$PY" benchmarks/gpu_probes.py sweep-spec "$REPO" >"$work/spec.yaml" &&
                  "$PY" -m perfkit.cli sweep "$work/spec.yaml" --out "$work/sweep" --workers 1 >"$work/closing.txt"
                rc=$?
                cat "$work/closing.txt" >&2
                grep "^device busy" "$work/closing.txt" | sed 's/^/BUSY: /' >&2
                "$PY" -m perfkit.cli report "$work/sweep" -o "$work/sweep/report.html" >&2
                "$PY" -m perfkit.cli advise "$work/sweep" >"$work/sweep/advise.md"
                replay_check "$work/sweep" >&2
                cp "$work/spec.yaml" "$work/sweep/"
                tar -C "$work" -czf - sweep
                rm -rf "$work"
                return $rc ;;
  esac
}

declare -A OUTFILE=([env]=env.json [ceiling]=ceiling.json [gpu_tests]=gpu_tests.log [probes]=probes.jsonl
                    [nccl]=nccl.json [sweep]=sweep.tar.gz)
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
  export -f step_cmd replay_check; export PY REPO
  timeout --kill-after=10 "${LIMIT_S[$s]}" bash -c "step_cmd $s" >"$DEST/${OUTFILE[$s]}" 2>>"$LOG"
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  if [ $rc = 0 ]; then RESULT[$s]="ok (${dt} s)"
  elif [ $rc = 124 ] || [ $rc = 137 ]; then RESULT[$s]="timeout after ${dt} s"; failed=$((failed + 1))
  else RESULT[$s]="failed, exit $rc (${dt} s; see steps.log)"; failed=$((failed + 1))
  fi
  echo "   ${RESULT[$s]}"
  case "$s" in
    gpu_tests) tail -n 15 "$DEST/${OUTFILE[$s]}" ;;
    ceiling|probes) cut -c1-400 "$DEST/${OUTFILE[$s]}" ;;
  esac
done

# The sweep's device-busy share rides on its own line of the summary (one line per step).
busy="$(grep -h '^BUSY: ' "$LOG" | tail -n 1 | cut -c7-)"
if [ -n "$busy" ]; then
  RESULT[sweep]="${RESULT[sweep]}; $busy (H200 before: under 30 s of GPU work in 235 s of wall, <= 0.13)"
elif [ "$HAS_GPU" = 1 ]; then
  RESULT[sweep]="${RESULT[sweep]}; device busy: not measured (no closing line from perfkit sweep)"
fi
replay="$(grep -h '^REPLAY: ' "$LOG" | tail -n 1 | cut -c9-)"
[ -n "$replay" ] && RESULT[sweep]="${RESULT[sweep]}; predict: $replay"
{
  echo "gpu_check summary ($(( $(date +%s) - start_all )) s, outputs in $DEST)"
  for s in "${STEPS[@]}"; do printf '  %-11s %s\n' "$s" "${RESULT[$s]}"; done
  echo "wheels: $WHEEL_NOTE; $DEPS_NOTE"
} | tee "$DEST/summary.txt"
[ $failed = 0 ]
