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
  Rows of one field put by several puts with different dtypes come back in the first
  dtype that holds every one of their values exactly (bf16 and float16 in float32, int32
  and float32 in float64); where no dtype does (int64 and float32) the get raises
  :class:`TransferQueueStorageError` naming the field and the global indexes of each
  dtype's rows. A field that is a tensor in some puts and non-tensor in others comes back
  as a ``NonTensorStack`` of every row as it was put (tensor rows as tensors).
- **refused puts**: a put naming one key twice raises :class:`TransferQueueStorageError`
  before anything is stored (TransferQueue itself would refuse it only after storing it).
- **clear** (``kv_clear``, ``clear_samples``, ``clear_partition``): the directory forgets the
  rows; an object is freed once none of its rows is stored (and no reader still holds a
  view of it).
- **errors**: a directory or object that is gone (its actor killed) raises
  :class:`TransferQueueStorageError` at once, never a hang.

- **checkpoints** (``tq.save_checkpoint``, ``tq.load_checkpoint``): the stored rows as one
  checksummed Arrow IPC file per stored put plus a manifest, in ``DIR/arrow_dataproto/``
  (:func:`save_rows`, :func:`load_rows`); a load checks every file before it replaces the
  stored rows, and raises :class:`TransferQueueStorageError` naming a damaged or foreign file.
  ``docs/transfer_queue.md`` says how verl uses them and what a resume needs.

The directory lives as long as the TransferQueue controller (both are owned by the process
that called ``tq.init()`` first); ``tq.close()`` in that process kills it and frees
everything it holds. (``tq.close()`` still logs "close for _TQ_STORAGE with key
arrow_dataproto is not supported for now": TransferQueue 0.1.11 closes only its own backends
by name and offers no hook for others; the storage manager's ``close`` does the work.)
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import operator
import os
import threading
import uuid
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
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
            if object_id in self.objects:
                self.pinned[object_id] = data

    def register(self, partition: str, object_id: str, refs: list, indexes: list[int], fields: list[str]) -> None:
        """Record object ``object_id`` (``refs[0]``) as holding rows ``indexes`` of ``fields``.
        Its count of cells is that of the distinct cells it is the value of (an index given
        twice is the object's later row), as is each count taken from the objects it replaces.
        (Each row loop here and below runs in C: ``map``, ``dict.update``, ``Counter``.)"""
        placed = dict(zip(indexes, zip(itertools.repeat(object_id), itertools.count())))
        fields = list(dict.fromkeys(fields))
        if not placed or not fields:  # no cell: nothing to hold
            return
        with self.lock:
            self.objects[object_id] = [refs[0], len(placed) * len(fields)]
            replaced: Counter[str] = Counter()
            last: tuple[list, Counter[str]] = ([], Counter())
            for field in fields:
                cells = self.cells.setdefault((partition, field), {})
                if cells:
                    old = list(filter(None, map(cells.get, placed)))
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

    def snapshot(self, owned: bool = False) -> list[tuple[str, Any, dict[str, list[tuple[int, int]]]]]:
        """Every stored cell: ``[(partition, object ref, {field: [(row in the object, global index)]})]``,
        one entry per object; with ``owned``, every object is this actor's own (as :meth:`locate`)."""
        with self.lock:
            held: dict[tuple[str, str], dict[str, list[tuple[int, int]]]] = {}
            for (partition, field), cells in self.cells.items():
                for index, (object_id, row) in cells.items():
                    held.setdefault((partition, object_id), {}).setdefault(field, []).append((row, index))
            copies = [self._copy(o) for _, o in held if owned and o in self.pinned]
        for copy in copies:
            copy.result()
        with self.lock:
            if any(o not in self.objects for _, o in held):
                raise KeyError("rows were cleared while the checkpoint was being saved")
            return [(p, self.objects[o][0], fields) for (p, o), fields in held.items()]

    def restore(self, partition: str, object_id: str, refs: list, cells: dict[str, tuple[list[int], list[int]]]) -> None:
        """Record object ``refs[0]`` (this actor's own: a checkpoint's rows put again) as the value
        of each field's cells ``{field: (global indexes, rows in the object)}``."""
        with self.lock:
            count = 0
            for field, (indexes, rows) in cells.items():
                placed = dict(zip(indexes, zip(itertools.repeat(object_id), rows)))
                stored = self.cells.setdefault((partition, field), {})
                for old in filter(None, map(stored.get, placed)):
                    self._drop(old[0], 1)
                stored.update(placed)
                count += len(placed)
            if count:
                self.objects[object_id] = [refs[0], count]

    def load(self, folder: str, entries: list[dict]) -> None:
        """Put the rows of every file of a checkpoint's manifest ``entries`` (checked first: any
        file that cannot be loaded raises and changes nothing) as this actor's own objects, then
        forget every row held and map the checkpoint's in their place."""
        refs = [ray.put(_read_file(Path(folder), entry)) for entry in entries]
        with self.lock:
            self.cells.clear()
            self.objects.clear()
            self.pinned.clear()
            self.copies.clear()
            for entry, ref in zip(entries, refs):
                indexes = entry["indexes"]
                self.restore(entry["partition"], uuid.uuid4().hex, [ref], {
                    field: (indexes, list(range(len(indexes)))) if at is None else ([indexes[i] for i in at], at)
                    for field, at in entry["fields"].items()
                })

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


def _select(field: str, values: list, objs: np.ndarray, rows: np.ndarray, indexes: list[int], shared: dict) -> Any:
    """The rows ``(objs[i], rows[i])`` of field ``field`` (global indexes ``indexes``) whose value
    in object ``k`` is ``values[k]``: a view for one run of one object, else one copy
    (pieces of several puts joined by :func:`_join`)."""
    runs = _runs(objs, rows)
    if len(runs) == 1 and not isinstance(values[runs[0][0]], np.ndarray):
        o, a, b = runs[0]
        return _rows_of(values[o], lambda t: _rows.slice_rows(t, a, b, shared), b - a)
    if not np.any(objs != objs[0]) and not isinstance(values[runs[0][0]], np.ndarray):  # one object, another order
        key = ("index", rows.tobytes())  # one index tensor for every field of these rows: jagged ones share offsets
        index = shared[key] if key in shared else shared.setdefault(key, torch.from_numpy(rows.copy()))
        return _rows_of(values[runs[0][0]], lambda t: _rows.take(t, index, shared), len(rows))
    pieces, origins, at = [], [], 0
    for o, a, b in runs:
        value = values[o]
        if isinstance(value, np.ndarray):  # a non-tensor column
            pieces.append(value[a:b])
        else:
            pieces.append(_rows_of(value, functools.partial(_slice, start=a, stop=b, shared=shared), b - a))
        origins.append(indexes[at : at + b - a])
        at += b - a
    joined = _join(field, pieces, origins, shared)
    return NonTensorStack.from_list(joined.tolist()) if isinstance(joined, np.ndarray) else joined


def _join(field: str, pieces: list, origins: list[list[int]], shared: dict) -> Any:
    """The pieces' rows, in order, in one value (one copy); ``origins[i]`` are the global
    indexes of ``pieces[i]``'s rows (for errors).

    - every piece non-tensor (an object array): one object array;
    - tensor pieces and non-tensor ones: one object array of every row as it was put
      (a tensor piece's rows as tensors), as TransferQueue's SimpleStorage returns them;
    - tensor pieces of several dtypes: each cast to the first dtype (of theirs, else of
      int16, int32, int64, float32, float64, complex64, complex128) that holds every value of
      every one exactly (bf16 and float16 into float32, int32 and float32 into float64);
      where none does (int64 and float32), :class:`TransferQueueStorageError` naming the field and
      the global indexes of each dtype's rows;
    - then dense pieces of one row shape stay dense and jagged pieces stay jagged; other
      mixes become a nested tensor of the rows (jagged where one dimension varies, else
      strided), as TransferQueue's own backends build them;
    - nested TensorDicts: joined leaf by leaf, under the same rules.
    """
    arrays = [isinstance(p, np.ndarray) for p in pieces]
    if any(arrays):
        return np.concatenate([p if isinstance(p, np.ndarray) else _objects(_unbind(p), len(p)) for p in pieces])
    collections = {is_tensor_collection(p) for p in pieces}
    if collections == {True}:
        first = pieces[0]
        if any(set(p.keys()) != set(first.keys()) for p in pieces):
            raise TransferQueueStorageError(
                f"arrow_dataproto TransferQueue backend: field {field!r} holds TensorDicts with other keys in other puts "
                f"({_sources(origins, [sorted(p.keys()) for p in pieces])})"
            )
        content = {k: _join(f"{field}.{k}", [p[k] for p in pieces], origins, shared) for k in first.keys()}
        return TensorDict(content, batch_size=[sum(len(o) for o in origins), *first.batch_size[1:]])
    if collections != {False}:
        kinds = ["TensorDict" if is_tensor_collection(p) else "tensor" for p in pieces]
        raise TransferQueueStorageError(
            f"arrow_dataproto TransferQueue backend: field {field!r} is a TensorDict in some puts and a tensor "
            f"in others ({_sources(origins, kinds)}): get them in separate calls"
        )
    dtype = _common_dtype([p.dtype for p in pieces])
    if dtype is None:
        raise TransferQueueStorageError(
            f"arrow_dataproto TransferQueue backend: field {field!r} was put with dtypes no one dtype holds exactly "
            f"({_sources(origins, [p.dtype for p in pieces])}): get them in separate calls, or put one dtype"
        )
    pieces = [p if p.dtype == dtype else p.to(dtype) for p in pieces]
    nested = {p.is_nested for p in pieces}
    if nested == {False} and len({p.shape[1:] for p in pieces}) == 1:
        return _rows.cat(pieces, shared)
    if nested == {True} and all(p.layout == torch.jagged for p in pieces):
        return _rows.cat(pieces, shared)
    rows = [r for p in pieces for r in _unbind(p)]
    try:
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    except (RuntimeError, ValueError):
        return torch.nested.as_nested_tensor(rows, layout=torch.strided)


def _unbind(piece: Any) -> list:
    """The rows of a tensor (dense or nested) or TensorDict piece."""
    if is_tensor_collection(piece):
        return [_rows.map_rows(piece, functools.partial(_rows.row, i=i), None) for i in range(piece.batch_size[0])]
    return list(piece.unbind()) if piece.is_nested else list(piece.unbind(0))


def _sources(origins: list[list[int]], what: list) -> str:
    """``what[i]`` of each piece with the first global indexes of its rows, one entry per distinct ``what``."""
    seen: dict[str, list[int]] = {}
    for rows, w in zip(origins, what):
        seen.setdefault(str(w), []).extend(rows)
    return "; ".join(f"{w}: global indexes {rows[:5]}{' ...' if len(rows) > 5 else ''}" for w, rows in seen.items())


_WIDER = (torch.int16, torch.int32, torch.int64, torch.float32, torch.float64, torch.complex64, torch.complex128)


def _common_dtype(dtypes: list[torch.dtype]) -> torch.dtype | None:
    """The first of ``dtypes`` (then of ``_WIDER``) that holds every value of each exactly, or None."""
    distinct = list(dict.fromkeys(dtypes))
    for candidate in (*distinct, *_WIDER):
        if all(_holds(candidate, d) for d in distinct):
            return candidate
    return None


def _holds(dst: torch.dtype, src: torch.dtype) -> bool:
    """Whether every value of dtype ``src`` is a value of dtype ``dst`` (a cast is exact)."""
    if dst == src or src == torch.bool:
        return True
    if dst == torch.bool:
        return False
    if src.is_complex or dst.is_complex:
        if not dst.is_complex:
            return False
        part = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}
        return _holds(part[dst], part.get(src, src))
    if src.is_floating_point:
        if not dst.is_floating_point:
            return False
        s, d = torch.finfo(src), torch.finfo(dst)  # significand, range and subnormals
        return d.eps <= s.eps and d.max >= s.max and d.smallest_normal * d.eps <= s.smallest_normal * s.eps
    i = torch.iinfo(src)
    if dst.is_floating_point:  # integers up to 2**significand bits are exact
        return max(i.max, -i.min) <= 2 / torch.finfo(dst).eps
    o = torch.iinfo(dst)
    return o.min <= i.min and o.max >= i.max


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
        indexes = [int(i) for i in metadata.global_indexes]
        if len(set(indexes)) != len(indexes):  # TransferQueue refuses the put after storing it: refused here first
            twice = sorted(i for i, n in Counter(indexes).items() if n > 1)
            raise TransferQueueStorageError(
                f"arrow_dataproto TransferQueue backend: a put names global indexes {twice[:5]} more than once "
                "(duplicated keys): nothing was stored"
            )
        if not list(data.keys()):
            return
        dp = _to_dataproto(data)
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
            fields = {k: _select(k, [_field(o, k) for o in objects], where[k][0], where[k][1], indexes, shared) for k in asked}
            pieces.append((positions, fields, indexes))
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

    async def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Write every stored row into ``checkpoint_dir/arrow_dataproto/`` (see :func:`save_rows`)."""
        await asyncio.get_running_loop().run_in_executor(None, save_rows, self, checkpoint_dir)

    async def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Replace every stored row by those of ``checkpoint_dir/arrow_dataproto/`` (see :func:`load_rows`)."""
        await asyncio.get_running_loop().run_in_executor(None, load_rows, self, checkpoint_dir)

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
    """Fields of several partitions' rows, put back in the order of the metadata (one more copy;
    pieces of different dtypes or kinds joined by :func:`_join`)."""
    positions = np.fromiter(itertools.chain.from_iterable(p for p, _, _ in pieces), np.int64, rows)
    inverse = torch.from_numpy(np.argsort(positions, kind="stable"))
    origins = [indexes for _, _, indexes in pieces]
    out: dict[str, Any] = {}
    for k in asked:
        parts = [_objects(f[k].tolist(), len(f[k])) if isinstance(f[k], NonTensorStack) else f[k] for _, f, _ in pieces]
        joined = _join(k, parts, origins, {})
        if isinstance(joined, np.ndarray):
            out[k] = NonTensorStack.from_list(joined[inverse.numpy()].tolist())
        else:
            out[k] = _rows_of(joined, lambda t: _rows.take(t, inverse), rows)
    return out


# ---------------------------------------------------------------- checkpoints: Arrow IPC files


CHECKPOINT_FOLDER = NAME
"""The folder of ``tq.save_checkpoint``'s directory that holds this backend's files."""

MANIFEST = "manifest.json"
"""The manifest in :data:`CHECKPOINT_FOLDER`: which file holds which rows and fields."""

_FORMAT = "arrow_dataproto TransferQueue rows"


def save_rows(manager: ArrowStorageManager, checkpoint_dir: str | os.PathLike) -> None:
    """Write every stored row into ``checkpoint_dir/arrow_dataproto/``: one Arrow IPC file per
    stored put (``00000.arrow``, ... : :func:`arrow_dataproto.files.open_file`, ``arrow-dataproto
    inspect`` and ``pandas.read_feather`` open them), with checksums, and :data:`MANIFEST`
    naming each file's partition, the global index of each of its rows and the rows that
    hold each field (a field some of whose rows a later put replaced).

    The bytes go from the object store to the file without another copy in memory: a put
    whose rows are all stored (or one run of them) is written from views of its object; rows
    cleared before the save are left out (a put with some of its rows cleared is written with
    its stored rows only: one copy of those). Every file and the manifest are fsynced
    (TransferQueue then renames the checkpoint into place). Raises
    :class:`TransferQueueStorageError` if the directory is gone, and
    :class:`~arrow_dataproto.errors.EncodeError` if a file cannot be written.
    """
    from ..files import write_file

    folder = Path(checkpoint_dir) / CHECKPOINT_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    entries = manager._call("save", "snapshot")
    try:
        objects = ray.get([ref for _, ref, _ in entries])
    except ray.exceptions.ObjectLostError:  # a writer (or its node) gone: the directory's own copies
        entries = manager._call("save", "snapshot", True)
        objects = manager._fetch([ref for _, ref, _ in entries])
    files = []
    for number, ((partition, _, fields), dp) in enumerate(zip(entries, objects)):
        index_of = {row: index for cells in fields.values() for row, index in cells}
        rows = sorted(index_of)
        if rows == list(range(rows[0], rows[0] + len(rows))):
            part = dp if len(rows) == len(dp) else dp.slice(rows[0], rows[-1] + 1)  # views
        else:
            part = dp.select_idxs(rows)  # some rows cleared: one copy of those left
        tensors = [k for k in (dp.batch.keys() if dp.batch is not None else []) if k in fields]
        part = part.select(batch_keys=tensors, non_tensor_batch_keys=[k for k in dp.non_tensor_batch if k in fields])
        position = {row: i for i, row in enumerate(rows)}
        name = f"{number:05d}.arrow"
        write_file(folder / name, part, checksums=True)
        del part
        _fsync(folder / name)
        files.append({
            "file": name,
            "partition": partition,
            "indexes": [index_of[r] for r in rows],
            "fields": {
                field: None if len(cells) == len(rows) else sorted(position[r] for r, _ in cells)
                for field, cells in fields.items()
            },
        })
    del objects
    manifest = folder / MANIFEST
    manifest.write_text(json.dumps({"format": _FORMAT, "version": 1, "files": files}))
    _fsync(manifest)
    _fsync(folder)


def load_rows(manager: ArrowStorageManager, checkpoint_dir: str | os.PathLike) -> None:
    """Replace every stored row by those :func:`save_rows` wrote into ``checkpoint_dir``.

    Every file is read (memory-mapped) and checked against its checksums before anything
    changes: a missing, damaged or foreign file raises :class:`TransferQueueStorageError`
    naming it, and the stored rows stay as they were. Then each file's rows are put into
    the object store (one copy, owned by the directory, so they outlive this process) and
    the directory forgets the rows it held and maps the checkpoint's in their place.
    """
    folder = Path(checkpoint_dir) / CHECKPOINT_FOLDER
    entries = _read_manifest(folder / MANIFEST)
    manager._call("load", "load", str(folder), entries)


def _read_file(folder: Path, entry: dict) -> DataProto:
    """The rows of the manifest's ``entry``, memory-mapped and checked against their checksums
    and the manifest (:class:`TransferQueueStorageError` naming the file)."""
    from ..files import open_file

    path = folder / entry["file"]
    try:
        with open_file(path, verify=True, allow_pickle=True) as reader:
            if reader.num_batches != 1:
                raise ValueError(f"{reader.num_batches} batches, a checkpoint's file holds one")
            dp = reader.read_batch(0)
    except (DataProtoError, OSError, ValueError) as e:
        raise TransferQueueStorageError(
            f"arrow_dataproto TransferQueue checkpoint: {path} cannot be loaded: {type(e).__name__}: {e}; "
            "nothing was loaded"
        ) from e
    columns = set(dp.batch.keys() if dp.batch is not None else []) | set(dp.non_tensor_batch)
    rows = len(entry["indexes"])
    if len(dp) != rows or columns != set(entry["fields"]):
        raise TransferQueueStorageError(
            f"arrow_dataproto TransferQueue checkpoint: {path} holds {len(dp)} rows of {sorted(columns)}, "
            f"{folder / MANIFEST} lists {rows} rows of {sorted(entry['fields'])}; nothing was loaded"
        )
    return dp


def _read_manifest(manifest: Path) -> list[dict]:
    """The manifest's file entries, checked (:class:`TransferQueueStorageError` naming it)."""
    try:
        content = json.loads(manifest.read_text())
    except FileNotFoundError:
        raise TransferQueueStorageError(
            f"arrow_dataproto TransferQueue checkpoint: {manifest} not found: the checkpoint was not saved "
            "with the arrow_dataproto backend (or with include_storage=False)"
        ) from None
    except (OSError, ValueError) as e:
        raise TransferQueueStorageError(f"arrow_dataproto TransferQueue checkpoint: {manifest} cannot be read: {e}") from e
    try:
        if content.get("format") != _FORMAT or content.get("version") != 1:
            raise ValueError(f"format {content.get('format')!r} version {content.get('version')!r}")
        files = content["files"]
        for entry in files:
            if not (isinstance(entry["file"], str) and "/" not in entry["file"] and isinstance(entry["partition"], str)):
                raise ValueError(f"entry {entry!r}")
            if not all(isinstance(i, int) for i in entry["indexes"]) or not isinstance(entry["fields"], dict):
                raise ValueError(f"entry {entry['file']!r}")
            for at in entry["fields"].values():
                if at is not None and not all(isinstance(i, int) and 0 <= i < len(entry["indexes"]) for i in at):
                    raise ValueError(f"entry {entry['file']!r}: rows {at!r}")
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise TransferQueueStorageError(
            f"arrow_dataproto TransferQueue checkpoint: {manifest} is not this backend's manifest: {e}"
        ) from e
    return files


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
