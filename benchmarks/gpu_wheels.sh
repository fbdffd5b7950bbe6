#!/usr/bin/env bash
# Fill a folder with the wheels benchmarks/gpu_check.sh needs on a GPU node that has torch but not
# the notebooks' packages, and no network (the H200 of issue 43: 41 wheels, 40 MB for Python 3.12).
# Run it where a package index is reachable, for the node's Python and platform:
#
#   bash benchmarks/gpu_wheels.sh [--python 3.12] [--platform x86_64|aarch64] DIR
#   bash benchmarks/gpu_check.sh --wheels DIR          (on the node)
#
# It downloads binary wheels only (pip download --only-binary=:all:) of what the sweep step runs
# beyond torch (papermill, ipykernel, nbformat, holoviews, bokeh, ipywidgets, pyyaml, tqdm, and
# what they need), for CPython of that version on manylinux, then drops the wheels of what such
# a node has already and must keep its own of (torch and its CUDA libraries, numpy, pandas,
# pyarrow, pytest): an installed copy from the wheels would shadow them. Exit 2 on bad arguments.
set -u
PYVER=3.12
ARCH=x86_64
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PYVER="${2:-}"; shift 2 ;;
    --platform) ARCH="${2:-}"; shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | grep -v '^set -u' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_wheels: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
DIR="${1:-}"
[ -n "$DIR" ] || { echo "gpu_wheels: name the folder to fill (see --help)" >&2; exit 2; }
[[ "$PYVER" =~ ^3\.[0-9]+$ ]] || { echo "gpu_wheels: --python takes a version like 3.12, not $PYVER" >&2; exit 2; }
case "$ARCH" in x86_64|aarch64) ;; *) echo "gpu_wheels: --platform is x86_64 or aarch64, not $ARCH" >&2; exit 2 ;; esac
mkdir -p "$DIR" || exit 2

PLATFORMS=()
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
           manylinux_2_24 manylinux_2_17 manylinux2014; do
  PLATFORMS+=(--platform "${tag}_${ARCH}")
done
[ "$ARCH" = x86_64 ] && PLATFORMS+=(--platform manylinux1_x86_64)

python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --implementation cp \
  --python-version "$PYVER" "${PLATFORMS[@]}" -d "$DIR" \
  "papermill>=2.5" "ipykernel>=6.20" "nbformat>=5.9" "holoviews>=1.18" "bokeh>=3.3" "ipywidgets>=8.0" \
  "pyyaml>=6.0" "tqdm>=4.60" || { echo "gpu_wheels: pip download failed (above)" >&2; exit 1; }

# What the node keeps its own of.
shopt -s nullglob nocaseglob
for keep in torch triton nvidia_ numpy pandas pyarrow pytest pluggy iniconfig; do
  rm -f "$DIR"/${keep}*-*.whl
done
n=$(ls "$DIR"/*.whl | wc -l)
echo "gpu_wheels: $n wheels for CPython $PYVER on manylinux $ARCH in $DIR ($(du -sh "$DIR" | cut -f1)); on the node:"
echo "  bash benchmarks/gpu_check.sh --wheels $DIR"
