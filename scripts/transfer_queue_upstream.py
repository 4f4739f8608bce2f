"""Run TransferQueue's own backend-agnostic end-to-end tests with the ``arrow_dataproto`` backend.

    python scripts/transfer_queue_upstream.py GIT_DIR [pytest arguments]

``GIT_DIR``: a git directory of github.com/Ascend/TransferQueue (a clone's ``.git`` or a bare
mirror). The test files are read from its HEAD into a temporary folder (nothing is copied into
this repository), with a ``conftest.py`` that registers our backend, adds it to each test
module's ``BACKEND_CONFIGS`` and starts a bounded Ray first; ``TQ_TEST_BACKEND=arrow_dataproto``
selects it; ``test_checkpoint_e2e.py`` (one module-wide SimpleStorage config, ``_TQ_CONFIG``) gets
ours in its place, and its three tests of SimpleStorage's own checkpoint layout are deselected
(``SIMPLE_STORAGE_ONLY``). Run from the repository root with the venv that has ``arrow-dataproto[test]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

TESTS = [
    "tests/e2e/test_kv_interface_e2e.py",
    "tests/e2e/test_e2e_lifecycle_consistency.py",
    "tests/e2e/test_checkpoint_e2e.py",
]

CONFTEST = '''
import pytest
import ray
from omegaconf import OmegaConf

import arrow_dataproto.integrations.transfer_queue  # registers the backend

CONFIG = {
    "controller": {"polling_mode": True},
    "backend": {"storage_backend": "arrow_dataproto", "arrow_dataproto": {}},
}


def pytest_sessionstart(session):
    ray.init(num_cpus=2, object_store_memory=1024**3, include_dashboard=False, configure_logging=False)


# test_checkpoint_e2e.py's tests of SimpleStorage itself: its checkpoint folder
# (simple_storage/storage_unit_info.json), its storage-unit count, and its override of
# include_storage=False (forced to True for an in-memory backend: ours saves nothing then, as
# TransferQueue documents for other backends).
SIMPLE_STORAGE_ONLY = (
    "TestCheckpointRoundtrip::test_tensor_fields",
    "TestIncludeStorageFalse::",
    "TestCheckpointErrors::test_load_raises_on_storage_unit_count_mismatch",
)


def pytest_collection_modifyitems(config, items):
    for module in {item.module for item in items}:
        if hasattr(module, "BACKEND_CONFIGS"):
            module.BACKEND_CONFIGS["arrow_dataproto"] = CONFIG
        if hasattr(module, "_TQ_CONFIG"):  # test_checkpoint_e2e.py: one config, SimpleStorage's
            module._TQ_CONFIG = OmegaConf.create(CONFIG)
    skipped = [item for item in items if any(name in item.nodeid for name in SIMPLE_STORAGE_ONLY)]
    if skipped:
        config.hook.pytest_deselected(items=skipped)
        items[:] = [item for item in items if item not in skipped]


def pytest_sessionfinish(session):
    ray.shutdown()
'''


def main() -> int:
    git_dir, args = sys.argv[1], sys.argv[2:]
    with tempfile.TemporaryDirectory() as folder:
        for path in TESTS:
            text = subprocess.run(["git", "--git-dir", git_dir, "show", f"HEAD:{path}"], check=True,
                                  capture_output=True, text=True).stdout
            with open(os.path.join(folder, os.path.basename(path)), "w") as f:
                f.write(text)
        with open(os.path.join(folder, "conftest.py"), "w") as f:
            f.write(CONFTEST)
        env = {**os.environ, "TQ_TEST_BACKEND": "arrow_dataproto", "RAY_DEDUP_LOGS": "0"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", folder, folder, *args]
        return subprocess.run(command, env=env, cwd=folder).returncode


if __name__ == "__main__":
    sys.exit(main())
