"""Long runs and faults through Ray: no leak over many round trips, many concurrent readers
of one object, and an actor dying mid-call.

- 200 consecutive driver -> actor -> driver round trips of a PPO-shaped batch
  (:data:`ROWS` x (:data:`PROMPT` + :data:`RESPONSE`) tokens, see ``samples.ppo_batch``),
  each checked bit for bit. The object store's usage and both processes' memory are
  recorded after a warm-up, at the middle and at the end, and printed. A process's RSS
  also counts the object store's shared pages it has touched, which grows as Ray places
  objects at new addresses and is bounded by the store's size; the leak check is on
  private memory (RSS minus shared pages), which may grow by at most 20% + 200 MiB after
  the warm-up. The object store returns to what it held before the run.
- Eight actors decode the same object at the same time (copy-on-write, copying, then viewing
  the shared memory): all see exactly the driver's data.
- An actor killed (``os._exit``) while it holds a batch: the driver gets Ray's error, and
  both its own batch and the object in the store are bit-equal to a saved copy.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import sys
import time

import psutil
import pytest
import torch
from arrow_dataproto.testing import assert_dataproto_equal

from arrow_dataproto import DataProto, transport
from arrow_dataproto.testing.samples import nbytes, ppo_batch

ray = pytest.importorskip("ray", reason="ray is not installed (pip install arrow-dataproto[ray])")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module

ROWS, PROMPT, RESPONSE = 256, 1024, 1024
ROUND_TRIPS = 200
WARM_UP = 10
READERS = 8
MiB = 1024**2


def ppo() -> DataProto:
    return DataProto(*ppo_batch(rows=ROWS, prompt=PROMPT, response=RESPONSE, seed=3))


def digest(dp: DataProto) -> str:
    """SHA-256 of every key, dtype, shape and tensor byte, the non-tensor values and meta_info."""
    h = hashlib.sha256()
    for key, t in dp.batch.items(include_nested=True, leaves_only=True):
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    for key, values in dp.non_tensor_batch.items():
        h.update(f"{key}:{values.dtype}:{values.tolist()!r}".encode())
    h.update(repr(dp.meta_info).encode())
    return h.hexdigest()


class _Echo:
    def echo(self, dp: DataProto) -> DataProto:
        return dp

    def memory(self) -> tuple[int, int]:
        return memory()

    def digest_of(self, refs: list, copy: bool) -> tuple[int, str]:
        """The digest of the object ``refs[0]``, decoded in this process (``copy=False``: viewing shared memory)."""
        return os.getpid(), digest(transport.get(refs[0], copy=copy))

    def die_holding(self, refs: list) -> None:
        """Fetch the object zero-copy, start using it, and die mid-call."""
        dp = transport.get(refs[0], copy=False)
        float(dp.batch["old_log_probs"].sum())
        os._exit(1)


Echo = ray.remote(num_cpus=0)(_Echo)


def memory() -> tuple[int, int]:
    """``(RSS, private)`` bytes of this process; private is RSS minus shared pages (object store, libraries)."""
    info = psutil.Process().memory_info()
    return info.rss, info.rss - info.shared


def store_usage() -> tuple[int, int]:
    """``(MiB, objects)`` in the object store, from Ray's memory summary."""
    from ray._private.internal_api import memory_summary

    text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    used, objects = re.search(r"Plasma memory usage (\d+) MiB, (\d+) objects", text).groups()
    return int(used), int(objects)


def drained_store(expected: tuple[int, int], wait_s: float = 60) -> tuple[int, int]:
    """The object store's usage once it is back to ``expected`` (Ray frees objects
    asynchronously), or as it is after ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while (usage := store_usage()) != expected and time.monotonic() < deadline:
        time.sleep(0.5)
    return usage


@pytest.mark.slow
def test_round_trips_leave_no_leak(ray_session):
    dp = ppo()
    actor = Echo.remote()
    store_before = drained_store((0, 0), wait_s=30)  # earlier tests' objects, which Ray frees asynchronously, gone first
    figures = {}
    for i in range(ROUND_TRIPS + 1):
        assert_dataproto_equal(ray.get(actor.echo.remote(dp)), dp)
        if i in (WARM_UP, WARM_UP + (ROUND_TRIPS - WARM_UP) // 2, ROUND_TRIPS):
            figures[i] = (memory(), ray.get(actor.memory.remote()), store_usage())
    ray.kill(actor)
    store_after = drained_store(store_before)
    print(f"\n{ROUND_TRIPS} round trips of a {ROWS} x ({PROMPT} + {RESPONSE}) PPO batch, "
          f"{nbytes(dp.batch) / MiB:.0f} MiB of tensors")
    for i, ((driver_rss, driver_private), (actor_rss, actor_private), (store_mib, objects)) in figures.items():
        print(f"  after {i:3d}: driver RSS {driver_rss / MiB:6.0f} MiB (private {driver_private / MiB:4.0f}), "
              f"actor RSS {actor_rss / MiB:6.0f} MiB (private {actor_private / MiB:4.0f}), "
              f"object store {store_mib} MiB in {objects} objects")
    print(f"  object store before the run {store_before}, after it {store_after} (MiB, objects)")
    for who in (0, 1):  # driver, actor
        start, end = figures[WARM_UP][who][1], figures[ROUND_TRIPS][who][1]
        assert end < 1.2 * start + 200 * MiB, (who, start, end)
    assert store_after == store_before


@pytest.fixture(scope="module")
def readers(ray_session):
    group = [Echo.remote() for _ in range(READERS)]
    yield group
    for actor in group:
        ray.kill(actor)


@pytest.mark.parametrize("copy_mode", ["on_write", True, False], ids=["copy-on-write", "copy", "zero-copy"])
def test_eight_readers_of_one_object_see_exact_data(readers, copy_mode):
    dp = ppo()
    expected = digest(dp)
    ref = ray.put(dp)
    results = ray.get([r.digest_of.remote([ref], copy_mode) for r in readers])  # all submitted at once
    assert len({pid for pid, _ in results}) == READERS
    assert [d for _, d in results] == [expected] * READERS
    assert digest(transport.get(ref, copy=False)) == expected


def test_actor_killed_mid_call_leaves_the_batch_intact(ray_session):
    dp = ppo()
    saved = copy.deepcopy(dp)
    ref = ray.put(dp)
    doomed = Echo.remote()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(doomed.die_holding.remote([ref]))
    assert_dataproto_equal(dp, saved)
    assert_dataproto_equal(transport.get(ref, copy=False), saved)
