#!/usr/bin/env bash
# Create .venv (if missing) and install arrow-dataproto with its test extras,
# pinned by constraints.txt. Safe to run repeatedly; a no-op when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.installed-$(cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)"
if [ ! -e "$stamp" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -c constraints.txt -e ".[test]"
    rm -f "$VENV"/.installed-*
    touch "$stamp"
fi
