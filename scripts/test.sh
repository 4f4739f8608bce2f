#!/usr/bin/env bash
# Set up the virtual environments and run the whole test suite:
#   1. .venv (newest pinned tensordict): every test; extra arguments go to this pytest run;
#   2. .venv-compat (tensordict 0.10 + verl 0.9.1, a verl user's environment): the codec,
#      container, pickling and verl-integration tests. Skip it with ADP_SKIP_COMPAT=1.
# .venv-compat is set up in the background, so that its installs overlap the checks and the first
# pytest run. (Not beside .venv's own setup: both install this project in editable mode, which
# writes arrow_dataproto.egg-info here.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh main
compat_setup=
if [ "${ADP_SKIP_COMPAT:-0}" != 1 ]; then
    compat_log="$(mktemp)"
    bash scripts/setup.sh compat >"$compat_log" 2>&1 &
    compat_setup=$!
    # If a step below fails, stop the setup too (its pip is its child) and remove its log.
    # (Each command guarded: under set -e a failing one would end the trap early.)
    trap 'pkill -P "$compat_setup" 2>/dev/null || true; kill "$compat_setup" 2>/dev/null || true; rm -f "$compat_log"' EXIT
fi
# Import rules (pyproject.toml [tool.importlinter]): layers without cycles, no private names across modules.
PYTHONPATH=.:tests .venv/bin/lint-imports
# Types (pyproject.toml [tool.mypy]), in this venv only: tensordict 0.10 of .venv-compat ships no
# type information, so there every tensordict type is Any and mypy would check strictly less.
.venv/bin/mypy
# Two workers (pytest-xdist; ADP_TEST_WORKERS=0: one, with less memory); tests/conftest.py schedules
# by module (each on one worker, the big-memory ones together, the longest first) and fails the
# run if that schedule was not kept.
workers="${ADP_TEST_WORKERS:-2}"
.venv/bin/python -m pytest -n "$workers" "$@"
if [ -n "$compat_setup" ]; then
    if ! wait "$compat_setup"; then
        cat "$compat_log" >&2
        echo "scripts/setup.sh compat failed (its output is above)" >&2
        exit 1
    fi
    rm -f "$compat_log"
    trap - EXIT
    .venv-compat/bin/python -m pytest -n "$workers" -m "not slow" \
        tests/test_codec.py tests/test_protocol.py tests/test_pickling.py tests/test_dtypes.py \
        tests/test_objects.py tests/test_verl.py tests/test_verl_parity.py tests/test_compact.py \
        tests/test_wire.py tests/test_hostile_round4.py
fi
