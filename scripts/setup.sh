#!/usr/bin/env bash
# Create a virtual environment and install arrow-dataproto with the extras a command needs.
#   scripts/setup.sh          .venv with the test extras: the pinned versions of constraints.txt
#                             (newest tensordict)
#   scripts/setup.sh demo     .venv with only what the demo needs (the package and Ray); a .venv
#                             already set up for the tests serves as it is
#   scripts/setup.sh compat   .venv-compat: a verl user's environment (constraints-compat.txt:
#                             tensordict 0.10, verl 0.9.1 and what `import verl.protocol` needs)
# Safe to run repeatedly: a no-op when the venv already matches its pins.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
profile="${1:-main}"
case "$profile" in
    main)   venv=.venv;        constraints=constraints.txt;        extras=test ;;
    demo)   venv=.venv;        constraints=constraints.txt;        extras=demo ;;
    compat) venv=.venv-compat; constraints=constraints-compat.txt; extras=test ;;
    *) echo "usage: scripts/setup.sh [main|demo|compat]" >&2; exit 2 ;;
esac
[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
pins="$(cat pyproject.toml "$constraints" | sha1sum | cut -c1-12)"
stamp="$venv/.installed-$extras-$pins"
# The test extras include the demo's.
if [ -e "$stamp" ] || { [ "$extras" = demo ] && [ -e "$venv/.installed-test-$pins" ]; }; then
    exit 0
fi
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade pip
"${pip[@]}" -c "$constraints" -e ".[$extras]"
if [ "$profile" = compat ]; then
    # verl pins dependencies it does not need to import its protocol module: take the package alone.
    "${pip[@]}" --no-deps verl==0.9.1
    "${pip[@]}" -c "$constraints" omegaconf transformers
    # verl.single_controller and verl.trainer.main_ppo (the worker-group benchmark and the Hydra test)
    "${pip[@]}" -c "$constraints" codetiming hydra-core
fi
rm -f "$venv"/.installed-*
touch "$stamp"
