"""tensordict's own Arrow tables (``tensordict.to_arrow`` / ``tensordict.from_arrow``, tensordict
>= 0.15) and ours meet: our ``from_arrow`` reads theirs exactly, and theirs reads our portable
view where its types allow (the differences: docs/tensordict.md)."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pytest
import tensordict
import torch
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto.testing import assert_tensor_equal

if not hasattr(tensordict, "to_arrow"):
    pytest.skip(f"tensordict {tensordict.__version__} has no to_arrow/from_arrow (added in 0.15)", allow_module_level=True)

ROWS = 3
DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64,
          torch.float16, torch.float32, torch.float64, torch.bool]
"""Every dtype tensordict.to_arrow writes (bf16, fp8 and complex raise there)."""


def _values(dtype: torch.dtype, *shape: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(len(shape) + dtype.itemsize)
    raw = torch.randint(0, 100, (ROWS, *shape), generator=generator)
    if dtype.is_floating_point:
        return (raw.double() / 7).to(dtype)
    return (raw % 2).bool() if dtype == torch.bool else raw.to(dtype)


def _theirs() -> TensorDict:
    leaves = {f"{str(dtype).removeprefix('torch.')}": _values(dtype) for dtype in DTYPES}
    leaves |= {f"{str(dtype).removeprefix('torch.')}_2x3": _values(dtype, 2, 3) for dtype in DTYPES}
    leaves["jagged"] = torch.nested.nested_tensor([torch.arange(n) for n in (2, 0, 3)], layout=torch.jagged)
    leaves["nested"] = TensorDict({
        "x": _values(torch.float32, 4),
        "deeper": TensorDict({"z": _values(torch.int32, 2), "flag": _values(torch.bool)}, batch_size=[ROWS]),
        "y": _values(torch.int64),
    }, batch_size=[ROWS])
    return TensorDict(leaves, batch_size=[ROWS])


def _same(ours: TensorDict, theirs: TensorDict) -> None:
    """The same tree, keys in the same order, every leaf of the same dtype, shape and bits."""
    assert list(ours.keys()) == list(theirs.keys())
    for key in theirs.keys():
        a, b = ours[key], theirs[key]
        if isinstance(b, TensorDict):
            assert isinstance(a, TensorDict) and a.batch_size == b.batch_size
            _same(a, b)
        elif b.is_nested:
            assert a.is_nested and a.dtype == b.dtype
            assert [r.tolist() for r in a.unbind()] == [r.tolist() for r in b.unbind()]
        else:
            assert_tensor_equal(a, b)


def test_our_from_arrow_reads_tensordict_to_arrow_exactly():
    td = _theirs()
    table = tensordict.to_arrow(td)
    assert pa.types.is_struct(table.schema.field("nested").type)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dp = adp.from_arrow(table)
    # uint16 is also how our default form stores bf16: the warning says it was read as uint16
    assert [str(w.message).split(" (")[0] for w in caught] == ["columns 'uint16'"]
    assert dp.non_tensor_batch == {} and dp.meta_info == {}
    _same(dp.batch, td)
    # zero-copy: a float column views the table's own buffer
    column = table.column("float32").chunks[0]
    assert dp.batch["float32"].data_ptr() == column.buffers()[1].address


def test_a_struct_in_a_table_with_other_columns_stays_a_dict():
    table = tensordict.to_arrow(_theirs()).append_column("text", pa.array(["a", "b", "c"]))
    dp = adp.from_arrow(table, allow_pickle=False)
    assert "nested" not in dp.batch.keys() and dp.non_tensor_batch["nested"][0]["y"] == int(_theirs()["nested", "y"][0])


def test_tensordict_from_arrow_reads_our_portable_view():
    td = TensorDict({
        "bf16": _values(torch.float32, 5).bfloat16(),
        "f16": _values(torch.float16, 2, 2),
        "mask": _values(torch.bool, 4),
        "ids": _values(torch.int64, 6),
        "jagged": torch.nested.nested_tensor([torch.arange(n) for n in (1, 4, 2)], layout=torch.jagged),
        "extra": TensorDict({"values": _values(torch.float32, 3)}, batch_size=[ROWS]),
    }, batch_size=[ROWS])
    dp = adp.DataProto(td, {"uid": np.array(["a", "b", "c"], dtype=object)}, {"step": 1})
    back = tensordict.from_arrow(pa.Table.from_batches([adp.to_arrow(dp, portable=True)]))
    # widened to float32, every value exactly; nested keys as dotted names
    assert_tensor_equal(back["bf16"], td["bf16"].float())
    assert_tensor_equal(back["f16"], td["f16"].float())
    assert_tensor_equal(back["mask"], td["mask"])
    assert_tensor_equal(back["ids"], td["ids"])
    assert [r.tolist() for r in back["jagged"].unbind()] == [r.tolist() for r in td["jagged"].unbind()]
    assert_tensor_equal(back.unflatten_keys(".")["extra", "values"], td["extra", "values"])
    assert back["uid"].tolist() == ["a", "b", "c"]
    # and it comes back to us bit for bit through tensordict's own table
    again = adp.from_arrow(tensordict.to_arrow(back.exclude("uid")), schema=adp.to_arrow(dp).schema)
    assert_tensor_equal(again.batch["bf16"], td["bf16"])
    assert_tensor_equal(again.batch["extra", "values"], td["extra", "values"])
