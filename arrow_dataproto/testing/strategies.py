"""Hypothesis strategies for DataProtos: every dtype, rank, layout and nesting the format holds.

Needs ``hypothesis`` (a test dependency). :func:`dataprotos` draws a whole
DataProto; the other strategies draw its parts. Tensors hold random bytes, so
every NaN payload can occur; views (permuted, strided, expanded) occur too.
Hostile shapes of content have strategies of their own (issue 48): conjugate and
negative views (:func:`conjugate_views`), jagged columns on one sliced offsets
tensor (:func:`sliced_jagged_pairs`), lazy stacks, tensorclasses and TensorDict
subclasses inside a TensorDict (:func:`nested_collections`), batches whose object
column is widened or promoted part-way through a file (:func:`evolving_plans`) and
format versions of this major (:data:`minor_versions`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from hypothesis import strategies as st
from tensordict import LazyStackedTensorDict, TensorDict, tensorclass

from .._container import DataProto
from .._dtypes import STORAGE
from .._format import FORMAT_VERSION

__all__ = [
    "DTYPES",
    "STRIDED_DTYPES",
    "conjugate_views",
    "dataprotos",
    "dense_tensors",
    "evolving_plans",
    "jagged_tensors",
    "meta_infos",
    "minor_versions",
    "nested_collections",
    "non_tensor_columns",
    "random_bits",
    "sliced_jagged_pairs",
    "strided_nested_tensors",
    "tensordicts",
    "seeds",
]

DTYPES = sorted(STORAGE, key=str)
"""Every torch dtype the format stores."""



def random_bits(dtype: torch.dtype, shape, seed: int) -> torch.Tensor:
    """A contiguous tensor of ``shape`` with random bytes (every NaN payload is possible); bool holds 0/1."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8))
    if dtype == torch.bool:
        raw &= 1  # any other byte is not a valid torch bool
    return raw.view(dtype).view(*shape)


def _strided_nested_ok(dtype: torch.dtype) -> bool:
    try:
        torch.nested.nested_tensor([torch.zeros(1, dtype=torch.uint8).view(dtype)] * 2)
    except RuntimeError:
        return False
    return True


STRIDED_DTYPES = [d for d in DTYPES if _strided_nested_ok(d)]  # torch cannot build the others
seeds = st.integers(0, 2**32 - 1)


@st.composite
def dense_tensors(draw, batch_size: list[int]) -> torch.Tensor:
    """A dense tensor ``[*batch_size, ...]`` of rank <= 4, contiguous or a non-contiguous view."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = [*batch_size, *draw(st.lists(st.integers(0, 3), max_size=4 - len(batch_size)))]
    seed = draw(seeds)
    kind = draw(st.sampled_from(["contiguous", "permuted", "row_step", "expanded"]))
    if kind == "permuted":  # every stride reversed
        return random_bits(dtype, shape[::-1], seed).permute(*reversed(range(len(shape))))
    if kind == "row_step":  # every other row of a bigger tensor
        return random_bits(dtype, [2 * shape[0], *shape[1:]], seed)[::2]
    if kind == "expanded":  # one row repeated with stride 0
        return random_bits(dtype, [1, *shape[1:]], seed).expand(*shape)
    return random_bits(dtype, shape, seed)


@st.composite
def jagged_tensors(draw, rows: int) -> torch.Tensor:
    """A jagged nested tensor with ``rows`` rows, ragged dimension 1, 2 or 3, any dtype."""
    dtype = draw(st.sampled_from(DTYPES))
    ragged_idx = draw(st.integers(1, 3))
    other = draw(st.lists(st.integers(0, 3), min_size=ragged_idx - 1, max_size=3))
    lengths = draw(st.lists(st.integers(0, 4), min_size=rows, max_size=rows))
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)
    values = random_bits(dtype, [int(offsets[-1]), *other], draw(seeds)).movedim(0, ragged_idx - 1)
    if draw(st.booleans()):
        values = values.contiguous()
    return torch.nested.nested_tensor_from_jagged(values, offsets, jagged_dim=ragged_idx)


@st.composite
def strided_nested_tensors(draw, rows: int) -> torch.Tensor:
    """A strided-layout nested tensor: ``rows`` rows of one rank (1-3) but any shape."""
    dtype = draw(st.sampled_from(STRIDED_DTYPES))
    ndim = draw(st.integers(1, 3))
    shapes = draw(st.lists(st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim), min_size=rows, max_size=rows))
    return torch.nested.nested_tensor([random_bits(dtype, s, draw(seeds)) for s in shapes], dtype=dtype)


@st.composite
def tensordicts(draw, batch_size: list[int], depth: int = 0) -> TensorDict:
    """A TensorDict of dense, nested (when the batch has one dimension) and sub-TensorDict leaves."""
    keys = draw(st.lists(st.text("abcdefgh_", min_size=1, max_size=3), max_size=4, unique=True))
    kinds = ["dense"] + (["jagged", "strided"] if len(batch_size) == 1 else []) + (["td"] if depth < 2 else [])
    content = {}
    for key in keys:  # the drawn order, not sorted: key order must survive
        kind = draw(st.sampled_from(kinds))
        if kind == "dense":
            content[key] = draw(dense_tensors(batch_size))
        elif kind == "jagged":
            content[key] = draw(jagged_tensors(batch_size[0]))
        elif kind == "strided":
            content[key] = draw(strided_nested_tensors(batch_size[0]))
        else:
            sub_size = batch_size + draw(st.lists(st.integers(0, 2), max_size=1 if len(batch_size) < 2 else 0))
            content[key] = draw(tensordicts(sub_size, depth + 1))
    return TensorDict(content, batch_size=batch_size, device=draw(st.sampled_from([None, "cpu"])))


def _object_column(values: list) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=5)
)
_row_values = st.sampled_from(
    [
        st.text(max_size=6),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(),
        st.booleans(),
        st.one_of(st.none(), st.text(max_size=3)),
        st.lists(st.integers(-100, 100), max_size=3),
        st.fixed_dictionaries({"k": st.text(max_size=3), "v": st.floats(allow_nan=False)}),
    ]
)


@st.composite
def non_tensor_columns(draw, rows: int) -> dict[str, np.ndarray]:
    """Object columns (one Python type per column) and numeric numpy columns of any row shape."""
    columns = {}
    for i in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            values = draw(st.lists(draw(_row_values), min_size=rows, max_size=rows))
            columns[f"O{i}"] = _object_column(values)
        else:
            dtype = draw(st.sampled_from(["int8", "int64", "uint16", "float32", "float64", "bool"]))
            shape = [rows, *draw(st.lists(st.integers(0, 3), max_size=2))]
            high = 2 if dtype == "bool" else 256  # random bits; numpy bools hold 0 or 1
            raw = np.random.default_rng(draw(seeds)).integers(0, high, math.prod(shape) * np.dtype(dtype).itemsize)
            columns[f"N{i}"] = raw.astype(np.uint8).view(dtype).reshape(shape)
    return columns


meta_infos = st.dictionaries(
    st.text(max_size=4),
    st.recursive(
        _json_scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=6,
    ),
    max_size=4,
)


@st.composite
def dataprotos(draw) -> DataProto:
    """A DataProto with or without a batch (rank 1 or 2), non-tensor columns and JSON meta_info."""
    rows = draw(st.integers(0, 5))
    batch = None
    if draw(st.integers(0, 4)):  # mostly with a batch
        batch_size = [rows, *draw(st.lists(st.integers(0, 3), max_size=1))]
        batch = draw(tensordicts(batch_size))
    return DataProto(batch, draw(non_tensor_columns(rows)), draw(meta_infos))


# ---------------------------------------------------------------- hostile content (issue 48)


@st.composite
def conjugate_views(draw, batch_size: list[int]) -> torch.Tensor:
    """A tensor ``[*batch_size, ...]`` with torch's conjugate bit (a complex ``x.conj()``) or
    negative bit (``torch._neg_view`` of a float or complex tensor), or a conjugate jagged tensor."""
    dtype = draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]))
    shape = [*batch_size, *draw(st.lists(st.integers(0, 3), max_size=2))]
    t = random_bits(dtype, shape, draw(seeds))
    if dtype.is_complex and draw(st.booleans()):
        return t.conj()
    return torch._neg_view(t)


@st.composite
def sliced_jagged_pairs(draw, rows: int) -> dict[str, torch.Tensor]:
    """Two jagged tensors ``a`` and ``b`` of ``rows`` rows on one offsets tensor that is a slice
    of a longer one (rows taken from a bigger jagged batch without copying): they share one
    ragged structure (``a * b`` works where torch multiplies the dtype)."""
    before, after = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    lengths = draw(st.lists(st.integers(0, 4), min_size=before + rows + after, max_size=before + rows + after))
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)
    dtype = draw(st.sampled_from(DTYPES))
    values = [random_bits(dtype, [int(offsets[-1]) + draw(st.integers(0, 2))], draw(seeds)) for _ in range(2)]
    sliced = offsets[before : before + rows + 1]
    return {name: torch.nested.nested_tensor_from_jagged(v, sliced) for name, v in zip("ab", values)}


@tensorclass
class _Observation:
    """A tensorclass the strategies nest (module level: tensordict's pickling finds it)."""

    pixels: torch.Tensor
    step: torch.Tensor


class _SubTD(TensorDict):
    """A TensorDict subclass the strategies nest."""


@st.composite
def nested_collections(draw, rows: int) -> TensorDict:
    """A TensorDict of ``rows`` rows holding, at depth 1 or 2, a ``LazyStackedTensorDict``
    (stacked TensorDicts with different keys or shapes, on dimension 0 or 1), a tensorclass or
    a TensorDict subclass, beside a dense column."""
    kind = draw(st.sampled_from(["lazy-keys", "lazy-shapes", "lazy-dim1", "tensorclass", "subclass"]))
    seed = draw(seeds)
    if kind in ("lazy-keys", "lazy-shapes"):
        tds = []
        for i in range(rows):
            td = TensorDict({"obs": random_bits(torch.float32, [2], (seed + i) % 2**32)}, [])
            if kind == "lazy-keys" and draw(st.booleans()):
                td["extra"] = torch.arange(i + 1)
            if kind == "lazy-shapes":
                td["v"] = random_bits(torch.float32, [draw(st.integers(0, 3))], seed ^ (i + 1))
            tds.append(td)
        inner: object = LazyStackedTensorDict(*tds, stack_dim=0) if tds else TensorDict({}, [0])
    elif kind == "lazy-dim1":
        tds = [TensorDict({"x": random_bits(torch.float32, [rows], seed), **({"y": torch.ones(rows)} if i else {})}, [rows]) for i in range(2)]
        inner = LazyStackedTensorDict(*tds, stack_dim=1)
    elif kind == "tensorclass":
        inner = _Observation(pixels=random_bits(torch.float32, [rows, 2], seed), step=torch.arange(rows), batch_size=[rows])  # type: ignore[call-arg]
    else:
        inner = _SubTD({"q": random_bits(torch.int64, [rows], seed)}, [rows])
    td = TensorDict({"nested": inner, "t": torch.arange(rows)}, batch_size=[rows])
    return TensorDict({"outer": td}, batch_size=[rows]) if draw(st.booleans()) else td


@st.composite
def evolving_plans(draw) -> list[DataProto]:
    """2-5 DataProtos of 1-4 rows each, with their own ``meta_info``, whose object column
    ``x`` holds ints first and then, at a drawn batch, values that widen it (floats) or
    promote it to JSON (dicts, mixed types): a file written from them is rewritten part-way."""
    count = draw(st.integers(2, 5))
    change = draw(st.integers(1, count - 1))
    later = draw(st.sampled_from([[1.5, 2.0], [{"k": 1}, {"j": "x"}], ["text", 3, None]]))
    plan = []
    for i in range(count):
        rows = draw(st.integers(1, 4))
        values = [j + i for j in range(rows)] if i < change else [later[j % len(later)] for j in range(rows)]
        plan.append(DataProto(None, {"x": _object_column(values)}, {"step": i, "note": "n" * draw(st.integers(0, 3))}))
    return plan


minor_versions = st.sampled_from([f"{FORMAT_VERSION[0]}.{minor}" for minor in range(FORMAT_VERSION[1] + 1)])
"""A format version of this library's major (every minor up to the current one)."""
