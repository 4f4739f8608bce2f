"""A TransferQueue storage backend on Ray's object store and this library's codec.

Importing this module registers the backend ``"arrow_dataproto"`` with TransferQueue
(``transferqueue`` 0.1.11, the ``transfer-queue`` extra); select it with::

    import arrow_dataproto.integrations.transfer_queue   # registers the backend
    tq.init(OmegaConf.create({"backend": {"storage_backend": "arrow_dataproto", "arrow_dataproto": {}}}))

Every process that calls ``tq.init()`` (or a ``tq.kv_*`` function) needs the backend
registered. One line does it in every Ray worker of a job (the hook imports nothing heavy;
the backend is imported right after ``transfer_queue`` is)::

    ray.init(runtime_env={"worker_process_setup_hook": "arrow_dataproto.integrations.register_transfer_queue"})

Stored rows outlive the process that put them. The writer's ``ray.put`` is registered with
the directory actor that ``tq.init()`` starts, which maps it before the put returns: from
then on its bytes stay pinned in the object store, whatever becomes of the writer. The
writer owns the object (Ray 2.56 removed ``ray.put(..., _owner=)``, and a copy is the only
other way to move ownership), so nothing more is copied while it lives. A reader that
finds the writer gone (its process exited, or its node: Ray's ``OwnerDiedError`` /
``ObjectLostError``) asks the directory again, which then puts its pinned bytes once
more, as an object of its own, and answers with that; later readers get it at once.
Pinned objects are not spilled to disk by Ray: clear rows no longer needed.
``conf.backend.arrow_dataproto.owner = "putter"`` registers the writer's object without
mapping it (the rows then live only as long as the writing process).

Contract:

- **put** (``kv_batch_put``, ``put``): the fields of one put become one :class:`DataProto`
  (tensor fields in ``batch``, ``NonTensorStack``/``NonTensorData`` fields in
  ``non_tensor_batch``), written with one ``ray.put``: one copy of the bytes into the
  object store, whole columns, not rows; the put returns once the directory has mapped
  it. A non-contiguous or off-CPU tensor is made contiguous on the CPU first (the codec's rule).
- **get** (``kv_batch_get``, ``get_data``): the reader fetches the objects holding the rows
  asked for and decodes them under the receive options in force (default: private
  copy-on-write views of shared memory, :mod:`arrow_dataproto.pickling`): a write in one
  reader reaches nobody else. Rows that are one put's rows in order (all or a run of
  them) are views; any other row set costs one copy of the selected bytes. Dense
  fields stay dense, jagged stay jagged, every dtype and shape exact; non-tensor fields
  come back as ``NonTensorStack``. Fields come back in the order asked
  (``select_fields``), else in the order the controller lists them (the order they were put).
- **clear** (``kv_clear``, ``clear_samples``, ``clear_partition``): the directory forgets the
  rows; an object is freed once none of its rows is stored (and no reader still holds a
  view of it).
- **errors**: a directory or object that is gone (its actor killed) raises
  :class:`TransferQueueStorageError` at once, never a hang.

The directory lives as long as the TransferQueue controller (both are owned by the process
that called ``tq.init()`` first); ``tq.close()`` in that process kills it and frees
everything it holds. Checkpoint hooks are not implemented (TransferQueue reports that).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import operator
import threading
import uuid
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, is_tensor_collection

from .._optional import missing_dependency

try:
    import ray
    from omegaconf import DictConfig
    from transfer_queue.metadata import BatchMeta, extract_field_schema
    from transfer_queue.storage.bootstrap.provider import StorageBootstrapProvider
    from transfer_queue.storage.managers.base import StorageManager, StorageManagerFactory
except ModuleNotFoundError as e:
    raise missing_dependency("arrow_dataproto.integrations.transfer_queue", e, "transfer-queue") from e

from .. import _rows
from .._container import DataProto
from ..errors import DataProtoError
from ..pickling import set_receive_options

NAME = "arrow_dataproto"
"""The backend's name: ``conf.backend.storage_backend`` and the section ``conf.backend[NAME]``."""

NAMESPACE = "transfer_queue"


class TransferQueueStorageError(DataProtoError, RuntimeError):
    """The backend's directory actor or a stored object is gone (killed, or its node lost),
    or rows asked for are not stored."""


# ---------------------------------------------------------------- the directory (one Ray actor)


class Directory:
    """Which object holds which row of which field, the references that keep the objects
    alive, and the mapped bytes of the objects their writers own (:meth:`adopt`).

    Every method runs under one lock: the main thread serves calls, a background thread
    puts this actor's own copies (:meth:`locate` with ``owned``).
    """

    def __init__(self) -> None:
        set_receive_options(copy=False)  # what arrives is only put again: plain views
        self.objects: dict[str, list] = {}  # object id -> [ObjectRef, live cells]
        self.cells: dict[tuple[str, str], dict[int, tuple[str, int]]] = {}  # (partition, field) -> index -> (id, row)
        self.pinned: dict[str, DataProto] = {}  # object id -> views of its writer's object, until this actor owns a copy
        self.copies: dict[str, Future] = {}  # object id -> this actor's copy of it, while under way (or failed)
        self.copier = ThreadPoolExecutor(1, thread_name_prefix="adp-own")
        self.lock = threading.RLock()

    def ready(self) -> bool:
        return True

    def _drop(self, object_id: str, cells: int) -> None:
        entry = self.objects[object_id]
        entry[1] -= cells
        if entry[1] <= 0:
            del self.objects[object_id]
            self.pinned.pop(object_id, None)
            self.copies.pop(object_id, None)

    def adopt(self, partition: str, object_id: str, refs: list, indexes: list[int], fields: list[str]) -> None:
        """Register the writer's object ``refs[0]`` and map it here before returning: its
        bytes stay pinned in the store even if the writer exits right after its put."""
        data = ray.get(refs[0])  # views of the writer's object (receive options: copy=False)
        with self.lock:
            self.register(partition, object_id, refs, indexes, fields)
            self.pinned[object_id] = data

    def register(self, partition: str, object_id: str, refs: list, indexes: list[int], fields: list[str]) -> None:
        """Record object ``object_id`` (``refs[0]``) as holding rows ``indexes`` of ``fields``.
        (Each row loop here and below runs in C: ``map``, ``dict.update``, ``Counter``.)"""
        placed = dict(zip(indexes, zip(itertools.repeat(object_id), itertools.count())))
        with self.lock:
            self.objects[object_id] = [refs[0], len(indexes) * len(fields)]
            replaced: Counter[str] = Counter()
            last: tuple[list, Counter[str]] = ([], Counter())
            for field in fields:
                cells = self.cells.setdefault((partition, field), {})
                if cells:
                    old = list(filter(None, map(cells.get, indexes)))
                    if old != last[0]:  # else the same cells as the previous field's: the same counts
                        last = (old, Counter(map(_OBJECT, old)))
                    replaced.update(last[1])
                cells.update(placed)
            for old_id, count in replaced.items():
                self._drop(old_id, count)

    def locate(self, partition: str, fields: list[str], indexes: list[int], owned: bool = False) -> tuple[list, dict]:
        """``(refs, {field: (object numbers into refs, rows)})`` for the cells asked; with
        ``owned``, every object is this actor's own (put now from its pinned bytes where
        its writer still owns it)."""
        with self.lock:
            numbers: dict[str, int] = {}
            where = {}
            last: tuple[list | None, Any] = (None, None)  # no previous field yet
            for field in fields:
                cells = self.cells.get((partition, field), {})
                try:
                    found = list(map(cells.__getitem__, indexes))
                except KeyError as e:
                    raise KeyError(f"partition {partition!r}: field {field!r} has no stored row {e.args[0]}") from None
                if found == last[0]:  # fields of the same puts (the same cell objects: compared by identity first)
                    where[field] = last[1]
                    continue
                ids = list(map(_OBJECT, found))
                for object_id in dict.fromkeys(ids):
                    numbers.setdefault(object_id, len(numbers))
                objs = np.fromiter(map(numbers.__getitem__, ids), np.int64, len(found))
                rows = np.fromiter(map(_ROW, found), np.int64, len(found))
                where[field] = (objs, rows)
                last = (found, where[field])
            copies = [self._copy(i) for i in numbers if owned and i in self.pinned]
        for copy in copies:  # outside the lock: the copier takes it to finish
            copy.result()
        with self.lock:
            if any(i not in self.objects for i in numbers):
                raise KeyError(f"partition {partition!r}: rows asked were cleared meanwhile")
            return [self.objects[i][0] for i in numbers], where

    def _copy(self, object_id: str) -> Future:
        """This actor's copy of a pinned object, under way or done (under the lock)."""
        copy = self.copies.get(object_id)
        if copy is None or (copy.done() and copy.exception() is not None):  # a failed copy is tried again
            copy = self.copies[object_id] = self.copier.submit(self._own, object_id)
        return copy

    def _own(self, object_id: str) -> None:
        with self.lock:
            data = self.pinned.get(object_id)
        if data is None:  # cleared meanwhile, or owned already
            return
        failure = None
        try:
            ref = ray.put(data)
        except Exception as e:  # the store full, Ray shutting down: the bytes stay pinned, a later ask retries
            failure = f"{type(e).__name__}: {e}"
        del data  # raised below, outside the handler: no traceback holds the views
        if failure is not None:
            raise TransferQueueStorageError(f"the directory could not copy object {object_id}: {failure}")
        with self.lock:
            entry = self.objects.get(object_id)
            if entry is not None:  # else cleared meanwhile: the copy is dropped
                entry[0] = ref
            self.pinned.pop(object_id, None)
            self.copies.pop(object_id, None)

    def release(self, partition: str, indexes: list[int]) -> None:
        """Forget every field of rows ``indexes``; free each object none of whose cells is left."""
        with self.lock:
            released: Counter[str] = Counter()
            last: tuple[list, Counter[str]] = ([], Counter())
            for field in [f for p, f in self.cells if p == partition]:
                cells = self.cells[(partition, field)]
                popped = list(filter(None, map(cells.pop, indexes, itertools.repeat(None))))
                if popped != last[0]:  # else the same cells as the previous field's: the same counts
                    last = (popped, Counter(map(_OBJECT, popped)))
                released.update(last[1])
                if not cells:
                    del self.cells[(partition, field)]
            for object_id, count in released.items():
                self._drop(object_id, count)

    def held(self) -> int:
        """How many objects the directory keeps alive."""
        with self.lock:
            return len(self.objects)


_OBJECT, _ROW = operator.itemgetter(0), operator.itemgetter(1)  # of a cell: (object id, row in it)

_created_here: dict[str, Any] = {}  # directory name -> handle, in the process that started it


@StorageBootstrapProvider.register_provider(NAME)
def bootstrap(conf: DictConfig) -> dict[str, Any]:
    """Start the directory actor (run once by ``tq.init()``); its name goes into ``conf.backend[NAME]``."""
    name = f"arrow_dataproto.directory.{uuid.uuid4().hex[:12]}"
    actor: Any = ray.remote(Directory)
    handle = (
        actor.options(name=name, namespace=NAMESPACE, num_cpus=0, max_restarts=0)
        .remote()
    )
    ray.get(handle.ready.remote())
    if conf.backend.get(NAME) is None:
        conf.backend[NAME] = {}
    conf.backend[NAME].directory = name
    _created_here[name] = handle
    return {name: handle}


# ---------------------------------------------------------------- fields <-> one DataProto


def _to_dataproto(data: TensorDict) -> DataProto:
    """Tensor fields (and nested TensorDicts) into ``batch``, non-tensor fields into ``non_tensor_batch``
    (one object per row; ``NonTensorData`` holding a list/tuple/array of one value per row is read as
    those values, as TransferQueue's own backends do, any other ``NonTensorData`` is every row's value)."""
    rows = data.batch_size[0]
    tensors, others = {}, {}
    for key in data.keys():
        value = data.get(key)
        if isinstance(value, NonTensorStack):
            others[key] = _objects(value.tolist(), rows)
        elif isinstance(value, NonTensorData):  # a sequence with one value per row is those values, as in TQ
            per_row = isinstance(value.data, (list, tuple, np.ndarray)) and len(value.data) == rows
            others[key] = _objects(list(value.data) if per_row else [value.data] * rows, rows)
        else:
            tensors[key] = value
    batch = TensorDict(tensors, batch_size=data.batch_size[:1]) if tensors else None
    return DataProto(batch=batch, non_tensor_batch=others)


def _objects(values: list, rows: int) -> np.ndarray:
    out = np.empty(rows, dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _field(dp: DataProto, key: str) -> Any:
    """Field ``key`` of ``dp`` (``None`` when this object does not hold it)."""
    if dp.batch is not None and key in dp.batch.keys():
        return dp.batch.get(key)
    return dp.non_tensor_batch.get(key)


def _runs(objs: np.ndarray, rows: np.ndarray) -> list[tuple[int, int, int]]:
    """Maximal runs ``(object number, first row, stop row)`` of consecutive rows of one object."""
    breaks = np.flatnonzero((np.diff(objs) != 0) | (np.diff(rows) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [len(rows)]))
    return [(int(objs[a]), int(rows[a]), int(rows[a]) + int(b - a)) for a, b in zip(starts, stops)]


def _select(values: list, objs: np.ndarray, rows: np.ndarray, shared: dict) -> Any:
    """The rows ``(objs[i], rows[i])`` of one field whose value in object ``k`` is ``values[k]``:
    a view for one run of one object, else one copy."""
    runs = _runs(objs, rows)
    first = values[runs[0][0]]
    if isinstance(first, np.ndarray):  # a non-tensor column
        picked = np.concatenate([values[o][a:b] for o, a, b in runs])
        return NonTensorStack.from_list(picked.tolist())
    if len(runs) == 1:
        o, a, b = runs[0]
        return _rows_of(values[o], lambda t: _rows.slice_rows(t, a, b, shared), b - a)
    if not np.any(objs != objs[0]):  # one object, rows in another order: one gather
        index = torch.from_numpy(rows.copy())
        return _rows_of(first, lambda t: _rows.take(t, index, shared), len(rows))
    pieces = [_rows_of(values[o], functools.partial(_slice, start=a, stop=b, shared=shared), b - a) for o, a, b in runs]
    if is_tensor_collection(pieces[0]):
        return _rows.cat_rows(pieces, shared)
    return _join(pieces, shared)


def _join(pieces: list[torch.Tensor], shared: dict) -> torch.Tensor:
    """The pieces' rows in one tensor (one copy): dense if every piece is dense with one row shape,
    jagged if every piece is jagged, else a nested tensor of the rows (jagged where one dimension
    varies, strided otherwise), as TransferQueue's own backends build it."""
    nested = {p.is_nested for p in pieces}
    if nested == {False} and len({(p.shape[1:], p.dtype) for p in pieces}) == 1:
        return _rows.cat(pieces, shared)
    if nested == {True} and all(p.layout == torch.jagged for p in pieces):
        return _rows.cat(pieces, shared)
    rows = [r for p in pieces for r in (p.unbind() if p.is_nested else p.unbind(0))]
    try:
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    except (RuntimeError, ValueError):
        return torch.nested.as_nested_tensor(rows, layout=torch.strided)


def _slice(t: torch.Tensor, start: int, stop: int, shared: dict) -> torch.Tensor:
    return _rows.slice_rows(t, start, stop, shared)


def _rows_of(value: Any, fn: Callable[[torch.Tensor], torch.Tensor], rows: int) -> Any:
    return _rows.map_rows(value, fn, rows) if is_tensor_collection(value) else fn(value)


# ---------------------------------------------------------------- the storage manager


def _storage_error(error: BaseException, what: str) -> TransferQueueStorageError:
    return TransferQueueStorageError(
        f"arrow_dataproto TransferQueue backend: {what}: {type(error).__name__}: {error}. "
        "The directory actor started by tq.init() (or the node holding the data) is gone; "
        "the stored data is lost: call tq.close() and tq.init() again, and put the data again."
    )


@StorageManagerFactory.register(NAME)
class ArrowStorageManager(StorageManager):
    """TransferQueue's ``StorageManager`` for the ``"arrow_dataproto"`` backend (see the module docstring)."""

    def __init__(self, controller_info: Any, config: DictConfig, zmq_context: Any = None):
        name = config.get("directory") if config is not None else None
        if not name:
            raise TransferQueueStorageError(
                f"conf.backend.{NAME}.directory is not set: tq.init() did not run this backend's bootstrap "
                f"(import arrow_dataproto.integrations.transfer_queue before tq.init())"
            )
        owner = config.get("owner", "directory")
        if owner not in ("directory", "putter"):
            raise ValueError(f"conf.backend.{NAME}.owner must be 'directory' or 'putter', got {owner!r}")
        super().__init__(controller_info, config, zmq_context=zmq_context)
        self.owner = owner
        self.directory_name = str(name)
        try:
            self.directory = ray.get_actor(self.directory_name, namespace=NAMESPACE)
        except ValueError as e:
            raise _storage_error(e, f"no directory actor {self.directory_name!r}") from e

    def _call(self, what: str, method: str, *args: Any) -> Any:
        try:
            return ray.get(getattr(self.directory, method).remote(*args))
        except ray.exceptions.RayActorError as e:
            raise _storage_error(e, what) from e
        except ray.exceptions.RayTaskError as e:
            cause = e.as_instanceof_cause()
            if isinstance(cause, KeyError):
                raise TransferQueueStorageError(f"arrow_dataproto TransferQueue backend: {cause.args[0]}") from e
            if isinstance(cause, TransferQueueStorageError):
                raise TransferQueueStorageError(f"arrow_dataproto TransferQueue backend: {cause}") from e
            raise

    def _put(self, data: TensorDict, metadata: BatchMeta) -> None:
        dp = _to_dataproto(data)
        indexes = [int(i) for i in metadata.global_indexes]
        where = (metadata.partition_ids[0], uuid.uuid4().hex)
        method = "register" if self.owner == "putter" else "adopt"
        self._call("put", method, *where, [ray.put(dp)], indexes, list(data.keys()))

    async def put_data(self, data: TensorDict, metadata: BatchMeta, data_parser: Any = None) -> None:
        """Store the rows of ``data`` (one object for all its fields) and tell the controller."""
        if data_parser is not None:
            raise NotImplementedError("data_parser is supported only by TransferQueue's SimpleStorage backend")
        if data.batch_size[0] != metadata.size:
            raise ValueError(f"data has {data.batch_size[0]} rows, the metadata {metadata.size}")
        if metadata.size == 0:
            return
        if len(set(metadata.partition_ids)) != 1:
            raise ValueError(f"one put goes to one partition, got {sorted(set(metadata.partition_ids))}")
        await asyncio.get_running_loop().run_in_executor(None, self._put, data, metadata)
        await self.notify_data_update(metadata.partition_ids[0], list(metadata.global_indexes), extract_field_schema(data))

    def _get(self, metadata: BatchMeta) -> TensorDict:
        asked = list(metadata.field_schema)
        pieces = []
        for partition, positions in _by_partition(metadata.partition_ids):
            indexes = [int(metadata.global_indexes[p]) for p in positions]
            refs, where = self._call("get", "locate", partition, asked, indexes)
            try:
                objects = ray.get(refs)
            except ray.exceptions.ObjectLostError:  # a writer (or its node) gone: the directory's own copies
                refs, where = self._call("get", "locate", partition, asked, indexes, True)
                objects = self._fetch(refs)
            shared: dict = {}
            fields = {k: _select([_field(o, k) for o in objects], where[k][0], where[k][1], shared) for k in asked}
            pieces.append((positions, fields, len(indexes)))
        if len(pieces) == 1:
            fields = pieces[0][1]
        else:  # rows of several partitions, in the order asked
            fields = _merge(pieces, asked, metadata.size)
        return TensorDict({k: fields[k] for k in asked}, batch_size=[metadata.size])

    @staticmethod
    def _fetch(refs: list) -> list:
        try:
            return ray.get(refs)
        except (ray.exceptions.ObjectLostError, ray.exceptions.RayActorError) as e:
            raise _storage_error(e, "get") from e

    async def get_data(self, metadata: BatchMeta) -> TensorDict:
        """The rows and fields of ``metadata`` (views where they are one put's rows in order)."""
        if not metadata.field_schema or metadata.size == 0:
            return TensorDict({}, batch_size=[metadata.size])
        return await asyncio.get_running_loop().run_in_executor(None, self._get, metadata)

    async def clear_data(self, metadata: BatchMeta) -> None:
        """Forget the rows of ``metadata``, every field (the controller's metadata names only the
        fields all its rows have); free the objects left without rows."""
        for partition, positions in _by_partition(metadata.partition_ids):
            indexes = [int(metadata.global_indexes[p]) for p in positions]
            await asyncio.get_running_loop().run_in_executor(
                None, self._call, "clear", "release", partition, indexes
            )

    def close(self) -> None:
        """Close the controller sockets; in the process that started the directory, kill it (freeing its objects)."""
        handle = _created_here.pop(getattr(self, "directory_name", ""), None)
        if handle is not None:
            try:
                ray.kill(handle)
            except Exception:  # Ray already shut down: nothing is left to free
                pass
        super().close()


def _by_partition(partition_ids: list[str]) -> list[tuple[str, list[int]]]:
    """``[(partition, positions)]`` in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for position, partition in enumerate(partition_ids):
        groups.setdefault(partition, []).append(position)
    return list(groups.items())


def _merge(pieces: list, asked: list[str], rows: int) -> dict:
    """Fields of several partitions' rows, put back in the order of the metadata (one more copy)."""
    positions = np.fromiter(itertools.chain.from_iterable(p for p, _, _ in pieces), np.int64, rows)
    inverse = torch.from_numpy(np.argsort(positions, kind="stable"))
    out: dict[str, Any] = {}
    for k in asked:
        parts = [f[k] for _, f, _ in pieces]
        if isinstance(parts[0], NonTensorStack):
            values = list(itertools.chain.from_iterable(p.tolist() for p in parts))
            out[k] = NonTensorStack.from_list([values[i] for i in inverse.tolist()])
        elif is_tensor_collection(parts[0]):
            joined = _rows.cat_rows(parts)
            out[k] = _rows.map_rows(joined, lambda t: _rows.take(t, inverse), rows)
        else:
            out[k] = _rows.take(_rows.cat(parts), inverse)
    return out
