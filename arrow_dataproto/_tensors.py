"""One torch tensor <-> one Arrow column, without copying the bytes: the tensor column kinds.

Each kind is one class below with its encoder and decoder side by side; the
:data:`KINDS` table picks the kind of a tensor (encoding) or of a column's
:class:`~arrow_dataproto._format.TensorSpec` (decoding). ``docs/format.md``
has the Arrow layout of each:

:class:`Primitive` (``adp.kind`` ``tensor``, shape ``[B]``)
    a primitive column of ``B`` values.
:class:`FixedShape` (``tensor``, shape ``[B, d1..dn]``, and complex ``[B]``)
    an ``arrow.fixed_shape_tensor`` of shape ``[d1..dn]`` (``+ [2]`` for complex).
:class:`Jagged` (``jagged``)
    a ``torch.nested`` tensor with ``layout=torch.jagged``: a ``large_list``
    whose int64 offsets are the nested tensor's own and whose child holds its
    values, ragged dimension first, other dimensions flattened into a
    ``fixed_size_list`` element.
:class:`Strided` (``strided``)
    a ``torch.nested`` tensor with the strided layout (rows of any shape): a
    ``struct<data: large_list<T>, shape: fixed_size_list<int64>[ndim]>``.

Encoding copies nothing for a contiguous CPU tensor: the Arrow buffer is a view
of the tensor's memory and keeps the tensor alive. Non-contiguous tensors,
nested tensors with holes, and jagged tensors whose ragged dimension is not
outermost in memory are made contiguous first (one copy of that column).
A view into a larger storage exports only its own bytes. Tensors on another
device are copied to the CPU.

Decoding validates every length and offset against the buffers present, then
returns tensors that view the Arrow buffers (zero-copy) on the CPU. Values whose
buffer is not aligned to their element size are copied (Arrow IPC aligns buffers
to 8 bytes, complex128 needs 16).
"""

from __future__ import annotations

import math
from typing import ClassVar

import pyarrow as pa
import torch

from . import _jagged
from ._compat import nested_tensor_size, nested_view_from_buffer, ragged_idx, torch_function_off
from ._dtypes import STORAGE, Storage, storage_of
from ._format import TensorSpec
from ._validate import no_nulls
from .errors import DecodeError, EncodeError, column_error

# ---------------------------------------------------------------- shared by the kinds


def _buffer(t: torch.Tensor) -> pa.Buffer:
    """A zero-copy Arrow buffer over a contiguous CPU tensor's bytes (keeps ``t`` alive)."""
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return pa.py_buffer(b"")
    return pa.foreign_buffer(t.data_ptr(), nbytes, base=t)


def _flat_values(t: torch.Tensor, storage: Storage, element_shape: tuple[int, ...]) -> pa.Array:
    """The values of a contiguous tensor as a flat Arrow array, one element per row of ``t``.

    An element is ``element_shape`` values (times 2 for complex); a non-scalar
    element becomes a plain ``fixed_size_list``.
    """
    width = math.prod(element_shape) * storage.pair
    count = t.numel() * storage.pair
    value_type = storage.arrow_type
    raw_type = value_type.storage_type if isinstance(value_type, pa.BaseExtensionType) else value_type
    values = pa.Array.from_buffers(raw_type, count, [None, _buffer(t)])
    if raw_type is not value_type:
        values = pa.ExtensionArray.from_storage(value_type, values)
    if element_shape == () and storage.pair == 1:
        return values
    # Not FixedSizeListArray.from_arrays: it refuses a width of 0 (rows with a zero-size dimension).
    return pa.Array.from_buffers(pa.list_(values.type, width), t.shape[0], [None], children=[values])


def _elements(name: str, child: pa.Array, storage: Storage, dtype: torch.dtype, element_shape: list[int]) -> torch.Tensor:
    """Inverse of :func:`_flat_values`: view a flat child array (scalars or fixed_size_list
    elements) as ``[n, *element_shape]`` of ``dtype``."""
    width = math.prod(element_shape) * storage.pair
    if element_shape == [] and storage.pair == 1:
        flat = child
    else:
        if not pa.types.is_fixed_size_list(child.type) or child.type.list_size != width:
            raise _fail(name, f"elements of type {child.type}, expected fixed_size_list of {width}")
        no_nulls(name, child, _NULLS)
        flat = child.values.slice(child.offset * width, len(child) * width)  # the rows' values (flatten() is a compute call)
    values = _primitive_tensor(name, flat, storage)
    if values.data_ptr() % dtype.itemsize:  # torch crashes on misaligned complex128 (IPC aligns to 8 bytes only)
        values = values.view(torch.uint8).clone().view(values.dtype)
    if storage.torch_view != dtype:
        values = values.view(dtype)
    return values.view(len(child), *element_shape)


def _prepare(t: torch.Tensor) -> torch.Tensor:
    """Detached, on the CPU, with lazy conj/neg bits resolved (copies only if needed)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.resolve_conj().resolve_neg()


def _fail(name: str, message: str) -> DecodeError:
    return column_error(DecodeError, name, message)


_NULLS = "values in a tensor column"
"""What :func:`no_nulls` says of the nulls a tensor column cannot hold."""


def _primitive_tensor(name: str, array: pa.Array, storage: Storage) -> torch.Tensor:
    """A 1-D tensor viewing a primitive (or bool8) Arrow array's values, in the storage dtype."""
    if isinstance(array.type, pa.BaseExtensionType):
        array = array.storage
    no_nulls(name, array, _NULLS)
    expected = storage.arrow_type
    if isinstance(expected, pa.BaseExtensionType):
        expected = expected.storage_type
    if array.type != expected:
        raise _fail(name, f"values of type {array.type}, expected {expected}")
    return torch.from_dlpack(array)


def _list_parts(name: str, array: pa.Array) -> tuple[torch.Tensor, pa.Array]:
    """Offsets rebased to 0 and the child slice they cover, for a (possibly sliced) large_list."""
    if not pa.types.is_large_list(array.type):
        raise _fail(name, f"type {array.type}, expected large_list")
    if len(array) == 0:  # the offsets buffer of an empty list array may be absent
        return torch.zeros(1, dtype=torch.int64), array.values.slice(0, 0)
    offsets = torch.from_dlpack(array.offsets)
    start, end = int(offsets[0]), int(offsets[-1])
    child = array.values
    if not 0 <= start <= end <= len(child) or (len(offsets) > 1 and bool((offsets[1:] < offsets[:-1]).any())):
        raise _fail(name, "list offsets out of order or outside the values")
    if start:
        offsets = offsets - start
    return offsets, child.slice(start, end - start)


def _device(t: torch.Tensor) -> str:
    return str(t.device)


# ---------------------------------------------------------------- the kinds


class Primitive:
    """A dense ``[B]`` tensor of a real dtype: a primitive column."""

    kind: ClassVar[str] = "tensor"

    @staticmethod
    def takes(t: torch.Tensor, storage: Storage) -> bool:
        return t.dim() == 1 and storage.pair == 1

    @staticmethod
    def reads(spec: TensorSpec, storage: Storage) -> bool:
        return spec.kind == "tensor" and spec.shape == () and storage.pair == 1

    @staticmethod
    def encode(name: str, t: torch.Tensor, storage: Storage) -> tuple[pa.Array, TensorSpec]:
        spec = TensorSpec("tensor", t.dtype, (), _device(t))
        return _flat_values(_prepare(t).contiguous(), storage, ()), spec

    @staticmethod
    def decode(name: str, array: pa.Array, spec: TensorSpec, storage: Storage) -> torch.Tensor:
        return _elements(name, array, storage, spec.dtype, [])


class FixedShape:
    """A dense ``[B, d1..dn]`` tensor (or a complex ``[B]`` one): an ``arrow.fixed_shape_tensor``."""

    kind: ClassVar[str] = "tensor"

    @staticmethod
    def takes(t: torch.Tensor, storage: Storage) -> bool:
        return True  # any other dense tensor with a batch dimension

    @staticmethod
    def reads(spec: TensorSpec, storage: Storage) -> bool:
        return spec.kind == "tensor"

    @staticmethod
    def encode(name: str, t: torch.Tensor, storage: Storage) -> tuple[pa.Array, TensorSpec]:
        device = _device(t)
        t = _prepare(t).contiguous()
        row_shape = list(t.shape[1:])
        tensor_type = pa.fixed_shape_tensor(storage.arrow_type, row_shape + [2] * (storage.pair == 2))
        array = pa.ExtensionArray.from_storage(tensor_type, _flat_values(t, storage, tuple(row_shape)))
        return array, TensorSpec("tensor", t.dtype, tuple(row_shape), device)

    @staticmethod
    def decode(name: str, array: pa.Array, spec: TensorSpec, storage: Storage) -> torch.Tensor:
        shape = [int(n or 0) for n in spec.shape]  # dense: TensorSpec.parse refused ragged dimensions
        arrow_shape = shape + ([2] if storage.pair == 2 else [])
        if not isinstance(array.type, pa.FixedShapeTensorType) or list(array.type.shape) != arrow_shape:
            raise _fail(name, f"type {array.type}, expected fixed_shape_tensor of shape {arrow_shape}")
        permutation = array.type.permutation  # another tool's dimension order: not this format's row-major layout
        if permutation is not None and list(permutation) != list(range(len(arrow_shape))):
            raise _fail(name, f"fixed_shape_tensor with permutation {list(permutation)}, expected row-major values")
        if array.type.value_type != storage.arrow_type:
            raise _fail(name, f"value type {array.type.value_type}, expected {storage.arrow_type}")
        return _elements(name, array.storage, storage, spec.dtype, shape)


class Jagged:
    """A jagged ``torch.nested`` tensor: a ``large_list`` over its values, ragged dimension first."""

    kind: ClassVar[str] = "jagged"

    @staticmethod
    def takes(t: torch.Tensor, storage: Storage) -> bool:
        return _jagged.is_jagged(t)

    @staticmethod
    def reads(spec: TensorSpec, storage: Storage) -> bool:
        return spec.kind == "jagged"

    @staticmethod
    def encode(name: str, t: torch.Tensor, storage: Storage) -> tuple[pa.Array, TensorSpec]:
        device = _device(t)
        values, offsets = _jagged.parts(t)
        values, offsets = _prepare(values), _prepare(offsets).to(torch.int64)
        start, end = int(offsets[0]), int(offsets[-1])
        if start != 0 or end != values.shape[0]:  # export only this tensor's rows
            values = values[start:end]
            offsets = offsets - start
        values = values.contiguous()
        offsets = offsets.contiguous()
        child = _flat_values(values, storage, tuple(values.shape[1:]))
        array = pa.Array.from_buffers(
            pa.large_list(child.type), offsets.numel() - 1, [None, _buffer(offsets)], children=[child]
        )
        ragged = ragged_idx(t)
        row_shape = tuple(None if i == ragged - 1 else n for i, n in enumerate(t.shape[1:]))
        return array, TensorSpec("jagged", t.dtype, row_shape, device, ragged)

    @staticmethod
    def decode(name: str, array: pa.Array, spec: TensorSpec, storage: Storage) -> torch.Tensor:
        assert spec.ragged_idx is not None  # TensorSpec.parse checked it
        offsets, child = _list_parts(name, array)
        element_shape = [int(n) for n in spec.shape if n is not None]
        values = _elements(name, child, storage, spec.dtype, element_shape)
        return _jagged.build(values, offsets, spec.ragged_idx)


class Strided:
    """A strided ``torch.nested`` tensor (rows of any shape): ``struct<data, shape>``."""

    kind: ClassVar[str] = "strided"

    @staticmethod
    def takes(t: torch.Tensor, storage: Storage) -> bool:
        return t.is_nested

    @staticmethod
    def reads(spec: TensorSpec, storage: Storage) -> bool:
        return spec.kind == "strided"

    @staticmethod
    def encode(name: str, t: torch.Tensor, storage: Storage) -> tuple[pa.Array, TensorSpec]:
        device = _device(t)
        t = _prepare(t)
        if not t.is_contiguous():
            t = t.contiguous()
        sizes = nested_tensor_size(t).contiguous()
        if t.size(0) == 0:  # torch keeps no row shape without rows: record 1-D rows
            sizes = torch.zeros(0, 1, dtype=torch.int64)
        if sizes.dim() != 2 or sizes.shape[1] == 0:
            raise column_error(EncodeError, name, "a strided nested tensor needs rows of at least one dimension")
        counts = sizes.prod(dim=1)
        offsets = torch.zeros(len(counts) + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=offsets[1:])
        values = _flat_values(t.values()[: int(offsets[-1])].contiguous(), storage, ())
        ndim = sizes.shape[1]
        data = pa.Array.from_buffers(pa.large_list(values.type), len(counts), [None, _buffer(offsets)], children=[values])
        shape = pa.FixedSizeListArray.from_arrays(
            pa.Array.from_buffers(pa.int64(), sizes.numel(), [None, _buffer(sizes)]), ndim
        )
        array = pa.StructArray.from_arrays([data, shape], names=["data", "shape"])
        return array, TensorSpec("strided", t.dtype, (None,) * ndim, device)

    @staticmethod
    def decode(name: str, array: pa.Array, spec: TensorSpec, storage: Storage) -> torch.Tensor:
        if not pa.types.is_struct(array.type) or [f.name for f in array.type] != ["data", "shape"]:
            raise _fail(name, f"type {array.type}, expected struct<data, shape>")
        ndim = len(spec.shape)
        data, sizes_array = array.field("data"), array.field("shape")
        if sizes_array.type != pa.list_(pa.int64(), ndim):
            raise _fail(name, f"shape field of type {sizes_array.type}, expected fixed_size_list<int64>[{ndim}]")
        if len(array) == 0:  # torch cannot view an empty buffer as rows (it crashes)
            return torch.nested.nested_tensor([], dtype=spec.dtype)
        no_nulls(name, sizes_array, _NULLS)
        sizes = torch.from_dlpack(sizes_array.flatten()).view(len(array), ndim)
        offsets, child = _list_parts(name, data)
        # Bound the products first: an int64 product that wraps around could match a row length.
        if bool((sizes < 0).any()) or bool((sizes.clamp(min=1).double().prod(dim=1) > 2.0**62).any()):
            raise _fail(name, "row shapes out of range")
        if not torch.equal(offsets[1:] - offsets[:-1], sizes.prod(dim=1)):
            raise _fail(name, "row shapes do not match the row lengths")
        values = _elements(name, child, storage, spec.dtype, [])
        strides = torch.ones_like(sizes)
        if ndim > 1:
            strides[:, :-1] = sizes.flip(1)[:, :-1].cumprod(1).flip(1)
        return nested_view_from_buffer(values, sizes, strides, offsets[:-1].contiguous())


KINDS = (Jagged, Strided, Primitive, FixedShape)
"""The tensor column kinds, most specific first: the first that takes a tensor (or reads a spec) wins."""


# ---------------------------------------------------------------- entry points


def encode_tensor(name: str, t: torch.Tensor) -> tuple[pa.Array, TensorSpec]:
    """Encode one TensorDict leaf as an Arrow column and its spec (the field metadata).

    Raises :class:`EncodeError` for an unsupported dtype, layout or device.
    """
    if not isinstance(t, torch.Tensor):
        raise column_error(EncodeError, name, f"expected a torch.Tensor, got {type(t).__name__}")
    with torch_function_off():  # a jagged tensor's attribute reads: 0.1 us each, not 10
        return _encode_tensor(name, t)


def _encode_tensor(name: str, t: torch.Tensor) -> tuple[pa.Array, TensorSpec]:
    if t.device.type == "meta":
        raise column_error(EncodeError, name, "tensors on the meta device hold no data")
    storage = storage_of(t.dtype, name)
    if not t.is_nested:
        if t.layout != torch.strided:
            raise column_error(EncodeError, name, f"layout {t.layout} is not supported (use dense or nested)")
        if t.dim() == 0:
            raise column_error(EncodeError, name, "a 0-d tensor has no batch dimension")
    kind = next(k for k in KINDS if k.takes(t, storage))
    return kind.encode(name, t, storage)


def decode_tensor(name: str, array: pa.Array, spec: TensorSpec) -> torch.Tensor:
    """Rebuild the tensor of one column on the CPU, viewing the Arrow buffers.

    Raises :class:`DecodeError` (naming the column) when the spec and the array
    disagree, the column has nulls, or an offset/shape points outside the
    buffers present.
    """
    storage = STORAGE[spec.dtype]
    no_nulls(name, array, _NULLS)
    kind = next(k for k in KINDS if k.reads(spec, storage))
    return kind.decode(name, array, spec, storage)
