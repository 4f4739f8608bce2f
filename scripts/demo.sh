#!/usr/bin/env bash
# Set up .venv and run the demo: build a realistic PPO batch, round-trip it, print timings.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m arrow_dataproto.demo "$@"
