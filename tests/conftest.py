import os

import pytest

# A child interpreter's bare ``ray.init()`` starts its own Ray instead of joining the newest
# cluster it finds on this machine (another test's, when the suite runs on two workers).
os.environ.setdefault("RAY_ADDRESS", "local")

# Every Ray the tests start (here and in children) spills and makes fallback allocations on a
# disk however full: by default Ray refuses both past 95% use (OutOfDiskError), which a shared CI
# disk can be while still holding gigabytes, far more than the few hundred MiB a test spills.
os.environ.setdefault("RAY_local_fs_capacity_threshold", "1")

# The modules whose tests (or their children) hold gigabytes: under ``pytest -n 2``
# (scripts/test.sh) they run one after another on one worker.
_BIG_MEMORY = {"test_limits.py", "test_objects.py", "test_cow.py", "test_longrun.py"}

# Then the longest other modules (seconds on two workers here: 152, 123, 74): the schedule
# takes units in collection order, so none of them is left to run alone at the end.
_LONG = ["test_hostile.py", "test_transfer_queue.py", "test_notebook.py"]

# Tests of minutes (with verl installed): each a unit of its own, scheduled before all others.
_ALONE = {"tests/test_verl.py::test_worker_group_benchmark_at_tiny_size"}

_by_module = False  # whether this run schedules so (set in xdist's controller)
_ran_on: dict[str, set[str]] = {}  # work unit -> the workers that ran its tests


def _work_unit(nodeid: str) -> str:
    """The unit a test is scheduled in: its module, one unit for the big-memory modules, or itself."""
    if nodeid in _ALONE:
        return nodeid
    module = nodeid.split("::", 1)[0]
    return "big-memory" if module.rsplit("/", 1)[-1] in _BIG_MEMORY else module


def pytest_xdist_make_scheduler(config, log):
    """Under ``pytest -n N`` (xdist's default ``--dist load``): each module's tests stay together,
    in order, on one worker (module fixtures and tests that run last rely on it), and the
    big-memory modules share one worker. (Not ``--dist loadgroup`` with marks: xdist 3.8 does not
    see them under pytest 9.2, pytest-dev/pytest-xdist#1386.)"""
    global _by_module
    if config.getvalue("dist") != "load":
        return None  # another --dist asked for: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    _by_module = True
    config.option.loadscopereorder = False  # units in collection order, big-memory first (below)

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    return ByModule(config, log)


def pytest_collection_modifyitems(config, items):
    """In an xdist worker (whose collection order is the schedule's): the tests alone, the
    big-memory modules (386 s), the long ones, then the rest, each module's tests in their order."""
    if hasattr(config, "workerinput"):
        first = [*sorted(_BIG_MEMORY), *_LONG]

        def rank(item) -> int:
            if item.nodeid in _ALONE:
                return -1
            return first.index(item.path.name) if item.path.name in first else len(first)

        items.sort(key=rank)


def pytest_runtest_logreport(report):
    worker = getattr(report, "worker_id", None)  # on the reports xdist's controller receives
    if _by_module and worker is not None:
        _ran_on.setdefault(_work_unit(report.nodeid), set()).add(worker)


def _split_units() -> list[str]:
    return [f"{unit} ran on {', '.join(sorted(w))}" for unit, w in _ran_on.items() if len(w) > 1]


def pytest_sessionfinish(session):
    """The run fails if a unit was split across workers: the schedule above was not in effect."""
    if _split_units():
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    for line in _split_units():
        terminalreporter.write_line(f"tests/conftest.py: the schedule was not kept: {line}", red=True)


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
