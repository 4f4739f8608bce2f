#!/usr/bin/env bash
# One prepared check for a machine with a CUDA device (docs/devices.md):
#   1. find a Python with torch; install what is missing from wheels carried in the tree
#      (wheels/, dist/; never the internet: pip --no-index);
#   2. run every CUDA-marked test (pytest -m gpu);
#   3. run the short device benchmark (benchmarks/bench_device.py: decode onto the GPU from
#      IPC and from Ray, H2D floor and pinned staging, bf16/fp8/jagged exactness on the device);
#   4. write device-check.md (to $OUT if set, else benchmarks/results/) and print a summary.
# Without CUDA it says so, lists what it would run, and exits 0. Budget: under 8 minutes
# (each step has its own timeout). Exit status: 0 if every step passed (or no CUDA), else 1.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONPATH="$ROOT:$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}"

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for candidate in .venv/bin/python python3 python; do
        if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch" >/dev/null 2>&1; then
            PY=$candidate
            break
        fi
    done
fi
PY=${PY:-python3}

TESTS=(-m gpu -q -p no:cacheprovider tests)
BENCH=(benchmarks/bench_device.py)
RESULTS=${OUT:-$ROOT/benchmarks/results}
plan() {
    echo "It would run, in this order:"
    echo "  1. pip install --no-index --find-links wheels/ --find-links dist/ (only for missing modules:"
    echo "     pyarrow tensordict ray pytest hypothesis numpy)"
    echo "  2. $PY -m pytest ${TESTS[*]}      (every @pytest.mark.gpu test, timeout 300 s)"
    echo "  3. $PY ${BENCH[*]}      (device benchmark, timeout 150 s)"
    echo "  4. write $RESULTS/device-check.md and print a summary"
}

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    reason=$("$PY" -c "import torch; print(f'torch {torch.__version__}: torch.cuda.is_available() is False')" 2>/dev/null \
        || echo "no Python with torch found ($PY)")
    echo "device_check: no CUDA device here ($reason); nothing run."
    plan
    exit 0
fi

START=$SECONDS
status=0
summary=()
step() {  # step NAME TIMEOUT COMMAND...: run, log, and record PASS/FAIL with the time taken
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    echo "== $name"
    timeout "$limit" "$@" 2>&1 | tee "$RESULTS/device-check-$name.log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" = 0 ]; then
        summary+=("PASS  $name ($((SECONDS - t0)) s)")
    else
        summary+=("FAIL  $name (exit $rc$([ "$rc" = 124 ] && echo ', timed out'), $((SECONDS - t0)) s)")
        status=1
    fi
}
mkdir -p "$RESULTS"

missing=$("$PY" - <<'EOF'
import importlib.util
print(" ".join(m for m in ("numpy", "pyarrow", "tensordict", "ray", "pytest", "hypothesis") if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
    links=()
    for d in wheels dist; do [ -d "$d" ] && links+=(--find-links "$d"); done
    step install 120 "$PY" -m pip install --no-index "${links[@]}" $missing
else
    summary+=("PASS  install (nothing missing)")
fi

step gpu-tests 300 "$PY" -m pytest "${TESTS[@]}"
step device-bench 150 "$PY" "${BENCH[@]}" --out "$RESULTS/device.md"

{
    echo "# device_check $(date -u +%FT%TZ)"
    echo
    "$PY" -c "import torch; print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}')"
    echo
    for line in "${summary[@]}"; do echo "- $line"; done
    echo
    [ -f "$RESULTS/device.md" ] && cat "$RESULTS/device.md"
} > "$RESULTS/device-check.md"

echo
echo "== device_check summary ($((SECONDS - START)) s; results in $RESULTS/device-check.md)"
for line in "${summary[@]}"; do echo "  $line"; done
exit $status
