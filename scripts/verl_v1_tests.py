"""Run verl's own v1 (TransferQueue) trainer tests with the ``arrow_dataproto`` backend.

    python scripts/verl_v1_tests.py GIT_DIR REV TEST [TEST ...] [-- pytest arguments]

``GIT_DIR``: a git directory of github.com/verl-project/verl (a clone's ``.git`` or a bare
mirror); ``REV``: the commit, tag or branch to read the tests from; ``TEST``: a file under
``tests/trainer/ppo/v1/`` (``test_replay_buffer_on_cpu.py``). The test files are read from
``REV`` into a temporary folder (nothing is copied into this repository), beside a
``conftest.py`` that starts a bounded Ray with 8 logical CPUs (TransferQueue's actors ask for
them, whatever the machine has) and wraps ``transfer_queue.init`` so that every ``tq.init()``
selects the ``arrow_dataproto`` backend, as a verl user turns it on.

``--verl-source`` (before ``--``) also puts ``REV``'s ``verl/`` package first on ``PYTHONPATH``
(for tests of a verl newer than the installed one, e.g. verl main's
``test_reissue_inflight_on_cpu.py``); without it the installed verl is tested.
``--backend default`` runs the same tests on TransferQueue's own backend (the baseline).

Run from the repository root with a Python that has verl and ``arrow-dataproto[transfer-queue]``
(importing ``verl.trainer.ppo.v1`` also needs pillow, cachetools, uvicorn, fastapi, torchdata,
peft and accelerate; ``PYTHONPATH`` is kept, so a folder of them can be added there).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

CONFTEST = '''
import pytest
import ray
import transfer_queue
from omegaconf import OmegaConf

BACKEND = {backend!r}
INITS = []  # tq.init() calls that selected arrow_dataproto

if BACKEND == "arrow_dataproto":
    import arrow_dataproto.integrations.transfer_queue  # registers the backend

    _init = transfer_queue.init

    def init(conf=None):
        """tq.init() with the arrow_dataproto backend selected (the caller's other settings kept)."""
        ours = OmegaConf.create({{"backend": {{"storage_backend": "arrow_dataproto", "arrow_dataproto": {{}}}}}})
        final = _init(ours if conf is None else OmegaConf.merge(conf, ours))
        client = transfer_queue.get_client()
        assert type(client.storage_manager).__name__ == "ArrowStorageManager", type(client.storage_manager)
        INITS.append(1)
        return final

    transfer_queue.init = init
    transfer_queue.interface.init = init


def pytest_sessionstart(session):
    ray.init(
        num_cpus=8,
        object_store_memory=1024**3,
        include_dashboard=False,
        configure_logging=False,
        runtime_env={{"worker_process_setup_hook": "arrow_dataproto.integrations.register_transfer_queue"}},
    )


def pytest_sessionfinish(session):
    ray.shutdown()


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"backend {{BACKEND}}: tq.init() calls on arrow_dataproto: {{len(INITS)}}")
'''


def main() -> int:
    argv = sys.argv[1:]
    args = argv[argv.index("--") + 1 :] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    source = "--verl-source" in ours
    backend = "arrow_dataproto"
    if "--backend" in ours:
        backend = ours[ours.index("--backend") + 1]
        ours = [a for i, a in enumerate(ours) if a != "--backend" and (i == 0 or ours[i - 1] != "--backend")]
    ours = [a for a in ours if a != "--verl-source"]
    if len(ours) < 3 or backend not in ("arrow_dataproto", "default"):
        print(__doc__, file=sys.stderr)
        return 2
    git_dir, rev, tests = ours[0], ours[1], ours[2:]
    with tempfile.TemporaryDirectory() as folder:
        for name in tests:
            text = subprocess.run(["git", "--git-dir", git_dir, "show", f"{rev}:tests/trainer/ppo/v1/{name}"],
                                  check=True, capture_output=True, text=True).stdout
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        with open(os.path.join(folder, "conftest.py"), "w") as f:
            f.write(CONFTEST.format(backend=backend))
        path = [os.getcwd()]
        if source:  # REV's verl package, read out of git
            verl = os.path.join(folder, "verl-source")
            os.mkdir(verl)
            archive = subprocess.run(["git", "--git-dir", git_dir, "archive", rev, "verl"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", verl], input=archive, check=True)
            path.append(verl)
        env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*path, env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", folder,
                   *[os.path.join(folder, name) for name in tests], *args]
        return subprocess.run(command, env=env, cwd=folder).returncode


if __name__ == "__main__":
    sys.exit(main())
