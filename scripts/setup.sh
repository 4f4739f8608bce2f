#!/usr/bin/env bash
# Create a virtual environment and install arrow-dataproto with its test extras.
#   scripts/setup.sh          .venv: the pinned versions of constraints.txt (newest tensordict)
#   scripts/setup.sh compat   .venv-compat: a verl user's environment (constraints-compat.txt:
#                             tensordict 0.10, verl 0.9.1 and what `import verl.protocol` needs)
# Safe to run repeatedly: a no-op when the venv already matches its pins.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
profile="${1:-main}"
case "$profile" in
    main)   venv=.venv;        constraints=constraints.txt ;;
    compat) venv=.venv-compat; constraints=constraints-compat.txt ;;
    *) echo "usage: scripts/setup.sh [main|compat]" >&2; exit 2 ;;
esac
[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
stamp="$venv/.installed-$(cat pyproject.toml "$constraints" | sha1sum | cut -c1-12)"
if [ ! -e "$stamp" ]; then
    pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
    "${pip[@]}" --upgrade pip
    "${pip[@]}" -c "$constraints" -e ".[test]"
    if [ "$profile" = compat ]; then
        # verl pins dependencies it does not need to import its protocol module: take the package alone.
        "${pip[@]}" --no-deps verl==0.9.1
        "${pip[@]}" -c "$constraints" omegaconf transformers
    fi
    rm -f "$venv"/.installed-*
    touch "$stamp"
fi
