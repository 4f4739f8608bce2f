"""Every optional path, tried where its package is missing: each must raise the library's
``MissingDependencyError`` naming the extra and a working install line.

    python tests/missing_extras.py                     in a venv with some extras missing (e.g. only
                                                       ``.[ray]``): tries the paths whose package is absent
    python tests/missing_extras.py --block pandas,ray  simulates those modules missing (tests/test_optional.py)

Prints one JSON line per path: ``{"path", "missing", "ok", "error"}``; exits 1 if a path that
should have failed otherwise did not.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import tempfile
from typing import Callable

EXTRA_OF = {"ray": "ray", "pandas": "interop", "polars": "interop", "tqdm": "progress", "xxhash": "integrity",
            "transfer_queue": "transfer-queue", "omegaconf": "transfer-queue"}


def _dataproto():
    import torch
    from tensordict import TensorDict

    import arrow_dataproto as adp

    return adp.DataProto(TensorDict({"x": torch.arange(6).view(3, 2)}, batch_size=[3]))


def _file(batches: int = 1) -> str:
    from arrow_dataproto import files

    path = os.path.join(tempfile.mkdtemp(), "f.arrow")
    files.write_file(path, [_dataproto()] * batches)
    return path


def _transport_get():
    from arrow_dataproto import transport

    transport.get([], copy=True)


def _tensordict_install():
    from arrow_dataproto.integrations import tensordict as adp_td

    try:
        adp_td.install()
    finally:
        adp_td.uninstall()


def _progress():
    from arrow_dataproto import files

    files.read_file(_file(batches=2), progress=True)


def _checksums():
    from arrow_dataproto import files

    files.write_file(os.path.join(tempfile.mkdtemp(), "c.arrow"), _dataproto(), checksums=True)


# path -> (the modules it needs, of which the first missing one is named, and what runs it)
PATHS: dict[str, tuple[tuple[str, ...], Callable[[], object]]] = {
    "import arrow_dataproto.pandas": (("pandas",), lambda: importlib.import_module("arrow_dataproto.pandas")),
    "DataProto.to_pandas": (("pandas",), lambda: _dataproto().to_pandas()),
    "import arrow_dataproto.polars": (("polars",), lambda: importlib.import_module("arrow_dataproto.polars")),
    "adp.ray_data": (("ray", "pandas"), lambda: importlib.import_module("arrow_dataproto").ray_data),
    "transport.get": (("ray",), _transport_get),
    "integrations.tensordict.install": (("ray",), _tensordict_install),
    "import arrow_dataproto.integrations.transfer_queue": (
        ("ray", "omegaconf", "transfer_queue"), lambda: importlib.import_module("arrow_dataproto.integrations.transfer_queue")),
    "read_file(progress=True)": (("tqdm",), _progress),
    "write_file(checksums=True)": (("xxhash",), _checksums),
}


def _present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--block", default="", help="comma-separated top-level modules to treat as missing")
    args = parser.parse_args(argv)
    for name in filter(None, args.block.split(",")):
        sys.modules[name] = None  # type: ignore[assignment]  # "import name" raises ModuleNotFoundError
    from arrow_dataproto.errors import DataProtoError

    failed = 0
    for path, (needs, run) in PATHS.items():
        missing = next((name for name in needs if not _present(name)), None)
        if missing is None:
            continue  # everything it needs is here
        extra = "transfer-queue" if "transfer_queue" in path else EXTRA_OF[missing]
        line = f'pip install -c constraints.txt -e ".[{extra}]"'
        try:
            run()
        except DataProtoError as e:
            text = str(e)
            ok = isinstance(e, ImportError) and f"needs {missing}" in text and line in text
            error = f"{type(e).__name__}: {text}"
        except BaseException as e:  # noqa: BLE001 - reported, not raised
            ok, error = False, f"{type(e).__name__}: {e}"
        else:
            ok, error = False, "no error"
        failed += not ok
        print(json.dumps({"path": path, "missing": missing, "ok": ok, "error": error}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
