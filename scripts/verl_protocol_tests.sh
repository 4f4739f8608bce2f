#!/usr/bin/env bash
# Run verl's own DataProto unit tests against arrow_dataproto.DataProto.
#
#   scripts/verl_protocol_tests.sh PATH/TO/test_protocol_on_cpu.py [pytest args...]
#
# The file is verl's (tests/test_protocol_on_cpu.py, e.g. `git -C verl show v0.9.0:tests/test_protocol_on_cpu.py`);
# nothing is downloaded here. A copy in a temporary folder has its imports swapped: `from verl import DataProto`
# and the helpers from `verl.protocol` come from arrow_dataproto (verl_api); verl's own tensordict_utils, which
# one test uses to build its input, still comes from verl, so this runs in .venv-compat (verl 0.9.1 installed).
set -euo pipefail
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: $0 PATH/TO/test_protocol_on_cpu.py [pytest args...]" >&2; exit 2; }
repo="$(cd "$(dirname "$0")/.." && pwd)"
source_file="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
shift
python="${PYTHON:-$repo/.venv-compat/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
sed -e 's/^from verl import DataProto$/from arrow_dataproto import DataProto/' \
    -e 's/^\( *\)from verl\.protocol import /\1from arrow_dataproto.verl_api import /' \
    "$source_file" > "$work/test_protocol_on_cpu.py"
if grep -nE '^ *(from verl import|from verl\.protocol import|import verl\.protocol)' "$work/test_protocol_on_cpu.py"; then
    echo "$0: the lines above still import verl's DataProto; the swap needs updating for this file" >&2
    exit 2
fi
cd "$work"
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$python" -m pytest -p no:cacheprovider "$@" test_protocol_on_cpu.py
