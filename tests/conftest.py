import os

import pytest

# A child interpreter's bare ``ray.init()`` starts its own Ray instead of joining the newest
# cluster it finds on this machine (another test's, when the suite runs on two workers).
os.environ.setdefault("RAY_ADDRESS", "local")

# The modules whose tests (or their children) hold gigabytes: one group, so that under
# ``pytest -n 2 --dist loadgroup`` (scripts/test.sh) they run one after another on one worker.
_BIG_MEMORY = {"test_limits.py", "test_objects.py", "test_cow.py", "test_longrun.py"}


def pytest_collection_modifyitems(config, items):
    """Each module's tests stay together, in order, on one worker (module fixtures and
    tests that run last rely on it); the big-memory modules share one group."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("big-memory" if name in _BIG_MEMORY else name))


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the whole test run (starting Ray takes ~10 s).

    CPUs and the shared-memory object store are bounded so that tests fit on a small
    machine; a test that needs its own cluster runs it in a subprocess.
    """
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install arrow-dataproto[ray])")
    if not ray.is_initialized():
        ray.init(
            address="local",  # always a fresh local instance, never another session's cluster
            num_cpus=4,
            object_store_memory=3 * 1024**3,
            include_dashboard=False,
            log_to_driver=True,
            configure_logging=False,
        )
    yield ray
    ray.shutdown()
