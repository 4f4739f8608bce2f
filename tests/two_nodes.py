"""A two-node Ray cluster (``ray.cluster_utils.Cluster`` on this machine) for tests that
run it in a child process, so that it neither depends on nor disturbs the session's Ray.

A test module runs itself as a script (:func:`run_as_child`); its ``main()`` opens the
cluster with :func:`two_nodes`. Each node has its own object store and one CPU.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
STORE = 128 * 1024**2


def run_as_child(script: str, done: str) -> None:
    """Run ``script`` in a fresh interpreter (tests/ on its path, no RAY_ADDRESS) and check
    that it exits 0 and prints ``done``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)
    child = subprocess.run(
        [sys.executable, os.path.abspath(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert child.returncode == 0, f"stdout:\n{child.stdout[-4000:]}\nstderr:\n{child.stderr[-8000:]}"
    assert done in child.stdout


@contextlib.contextmanager
def two_nodes(runtime_env: dict | None = None, **second_node) -> Iterator[None]:
    """A head node and a second node (``second_node``: extra ``add_node`` arguments, e.g.
    ``resources``), this process connected as the driver (with the job's ``runtime_env``);
    shut down on exit."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": STORE})
    cluster.add_node(num_cpus=1, object_store_memory=STORE, **second_node)
    ray.init(address=cluster.address, include_dashboard=False, configure_logging=False, runtime_env=runtime_env)
    try:
        yield
    finally:
        ray.shutdown()
        cluster.shutdown()
