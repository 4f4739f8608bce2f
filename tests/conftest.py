import pytest


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
