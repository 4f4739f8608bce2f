"""Run TransferQueue's own backend-agnostic end-to-end tests with the ``arrow_dataproto`` backend.

    python scripts/transfer_queue_upstream.py GIT_DIR [pytest arguments]

``GIT_DIR``: a git directory of github.com/Ascend/TransferQueue (a clone's ``.git`` or a bare
mirror). The test files are read from its HEAD into a temporary folder (nothing is copied into
this repository), with a ``conftest.py`` that registers our backend, adds it to each test
module's ``BACKEND_CONFIGS`` and starts a bounded Ray first; ``TQ_TEST_BACKEND=arrow_dataproto``
selects it. Run from the repository root with the venv that has ``arrow-dataproto[test]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

TESTS = ["tests/e2e/test_kv_interface_e2e.py", "tests/e2e/test_e2e_lifecycle_consistency.py"]

CONFTEST = '''
import pytest
import ray

import arrow_dataproto.integrations.transfer_queue  # registers the backend

CONFIG = {
    "controller": {"polling_mode": True},
    "backend": {"storage_backend": "arrow_dataproto", "arrow_dataproto": {}},
}


def pytest_sessionstart(session):
    ray.init(num_cpus=2, object_store_memory=1024**3, include_dashboard=False, configure_logging=False)


def pytest_collection_modifyitems(items):
    for module in {item.module for item in items}:
        if hasattr(module, "BACKEND_CONFIGS"):
            module.BACKEND_CONFIGS["arrow_dataproto"] = CONFIG


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
