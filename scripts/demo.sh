#!/usr/bin/env bash
# Set up .venv with what the demo needs (the package and Ray, not the test tools) and run it:
# build a realistic PPO batch, round-trip it every way, print warmed-up timings and ratios
# against verl's pickling. Arguments go to the demo (e.g. --rows 512 --no-ray; --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
exec .venv/bin/python -m arrow_dataproto.demo "$@"
