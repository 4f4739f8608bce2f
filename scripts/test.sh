#!/usr/bin/env bash
# Set up the virtual environments and run the whole test suite:
#   1. .venv (newest pinned tensordict): every test; extra arguments go to this pytest run;
#   2. .venv-compat (tensordict 0.10 + verl 0.9.1, a verl user's environment): the codec,
#      container, pickling and verl-integration tests. Skip it with ADP_SKIP_COMPAT=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh main
# Import rules (pyproject.toml [tool.importlinter]): layers without cycles, no private names across modules.
PYTHONPATH=.:tests .venv/bin/lint-imports
# Types (pyproject.toml [tool.mypy]), in this venv only: tensordict 0.10 of .venv-compat ships no
# type information, so there every tensordict type is Any and mypy would check strictly less.
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
if [ "${ADP_SKIP_COMPAT:-0}" != 1 ]; then
    bash scripts/setup.sh compat
    .venv-compat/bin/python -m pytest -m "not slow" \
        tests/test_codec.py tests/test_protocol.py tests/test_pickling.py tests/test_dtypes.py \
        tests/test_objects.py tests/test_verl.py tests/test_verl_parity.py tests/test_compact.py
fi
