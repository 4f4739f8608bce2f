"""DataProto <-> polars DataFrame, one row per sample, through the Arrow RecordBatch.

:func:`to_polars` gives polars the portable view (``to_arrow(data, portable=True)``,
``docs/format.md``), so every column shows as values polars computes on:

=================================================  ==========================================
DataProto                                          polars dtype
=================================================  ==========================================
``[B]`` int / float32 / float64 tensor             ``Int64`` ... / ``Float32`` / ``Float64``
bfloat16, float16, every float8 ``[B, n]``         ``Array(Float32, shape=(n,))`` (exact values)
bool ``[B, n]``                                    ``Array(Boolean, shape=(n,))``
``[B, d1, d2]`` tensor                             ``Array(T, shape=(d1, d2))``
jagged ``[B, j]`` / ``[B, j, d]``                  ``List(T)`` / ``List(Array(T, shape=(d,)))``
strings                                            ``String``
dicts of one set of keys / JSON column             ``Struct`` / ``String`` (the JSON text)
=================================================  ==========================================

polars keeps no metadata of ours (nor ``meta_info``): :func:`from_polars` takes the
original schema to give back every dtype, shape, layout, JSON column and ``meta_info``
exactly, whatever rows the frame kept (filtered, sorted, sampled, limited) and whatever
columns (selected, reordered): ``schema=`` is ``to_arrow(dp).schema`` (either form) or the
path of the file the frame was read from (``pl.read_ipc(path)``, which shows the default
file's stored types: ``Extension`` columns of the raw bits). Without ``schema=`` the frame
reads by the rule for other tools' tables (``docs/format.md``): the widened floats stay
float32, and columns that look like stored bits raise a ``StoredFormWarning``.

Copies: the widened columns (bf16, float8, float16) and bools are new memory in
:func:`to_polars`; polars' ``from_arrow`` decides for the others (it shares the Arrow
buffers where it can). :func:`from_polars` views the frame's Arrow buffers where the
codec can (``copy=True`` for tensors that own their memory).
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import torch

from ._optional import missing_dependency

try:
    import polars as pl
except ModuleNotFoundError as e:
    raise missing_dependency("arrow_dataproto.polars", e) from e

from ._codec import to_arrow
from ._container import DataProto
from ._decoding import from_arrow

__all__ = ["from_polars", "to_polars"]


def to_polars(data: Any) -> pl.DataFrame:
    """A DataProto (ours or verl's) or a TensorDict as a polars DataFrame of the portable view
    (the dtypes in the module docstring); keep ``to_arrow(data).schema`` (or write the file)
    to come back exactly with :func:`from_polars`."""
    frame = pl.from_arrow(to_arrow(data, portable=True), rechunk=False)
    assert isinstance(frame, pl.DataFrame)  # a RecordBatch gives a DataFrame
    return frame


def from_polars(
    df: pl.DataFrame,
    *,
    schema: pa.Schema | str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    copy: bool = False,
) -> DataProto:
    """The DataProto of a polars DataFrame: with ``schema=`` (``to_arrow(dp).schema``, or the
    original file's path) exactly what the frame's rows and columns held, as
    :func:`~arrow_dataproto.from_arrow` says; without it by the rule for other tools' tables.
    :class:`~arrow_dataproto.DecodeError` names a column whose values no longer fit."""
    return from_arrow(df.to_arrow(), schema=schema, device=device, copy=copy)
