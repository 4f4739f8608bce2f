"""Hostile input, round four (issue 48): one test per defect class, through public entry points.

Each test failed on the code before its fix: a file written with checksums across a
schema-evolution rewrite, nested collections and bare exceptions of the tensordict and verl
integrations, shared ragged offsets that are a slice, datasets of mixed minor versions, and the
CLI on other tools' files.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict, tensorclass

import arrow_dataproto as adp
from arrow_dataproto import files
from arrow_dataproto.testing import assert_dataproto_equal


def _objects(*rows) -> np.ndarray:
    out = np.empty(len(rows), dtype=object)
    out[:] = rows
    return out


# ---------------------------------------------------------------- checksums after a rewrite


def _promoting_plan() -> list[adp.DataProto]:
    """Batches of 1, 2, 3 and 1 rows, each with its own meta_info; the third promotes ``x`` to
    JSON, so the first two are rewritten."""
    rows = [[1], [2, 3], [{"k": 1}, "text", 5], [None]]
    return [adp.DataProto(non_tensor_batch={"x": _objects(*r)}, meta_info={"step": i, "tag": "t" * i}) for i, r in enumerate(rows)]


@pytest.mark.parametrize("options", [{}, {"compression": "zstd"}, {"portable": True}, {"stream": True}])
def test_a_file_rewritten_by_a_promotion_verifies(tmp_path, options):
    """Issue 48, 1: the rewrite checksummed each rewritten batch over the first batch's metadata,
    so every rewritten batch whose meta_info or row count differs from the first's failed verify()
    and open_file(verify=True) refused the file."""
    pytest.importorskip("xxhash", reason="checksums need the xxhash package")
    plan = _promoting_plan()
    path = tmp_path / "x.arrow"
    files.write_file(path, plan, checksums=True, **options)
    with files.open_file(path, verify=True) as reader:
        assert [c.kind for c in reader.column_info()] == ["json"]
        assert reader.verify() > 0
        got = [reader.read_batch(i) for i in range(reader.num_batches)]
    for a, b in zip(got, plan):
        assert_dataproto_equal(a, b)
    from arrow_dataproto.files.layout import verify_checksums  # the pyarrow-only check of `arrow-dataproto verify`

    assert verify_checksums(path)[0] == 4
    copies = [tmp_path / "copy.arrow", tmp_path / "recovered.arrow"]
    files.copy_file(path, copies[0], compression="lz4")
    if not options.get("stream"):  # recover_file reads the file format
        files.recover_file(path, copies[1])
    for copy in copies:
        if copy.exists():
            with files.open_file(copy, verify=True) as reader:
                assert reader.verify() > 0
                assert [len(reader.read_batch(i)) for i in range(reader.num_batches)] == [1, 2, 3, 1]


# ---------------------------------------------------------------- datasets of mixed minor versions

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize("kind", ["sample", "kinds", "pickled"])
def test_a_dataset_mixes_minor_versions_of_one_major(kind, tmp_path):
    """Issue 48, 5: golden files of 1.0-1.2 beside a 1.3 file were refused ("adp.version: 1.3,
    expected 1.0"), though each opens alone and format.md accepts every minor of the major."""
    paths = sorted(DATA.glob(f"golden-v1.*-{kind}.arrow"))
    assert [p.name[8:11] for p in paths] == ["1.0", "1.1", "1.2", "1.3"]
    written = tmp_path / "now.arrow"
    files.copy_file(paths[0], written)  # a copy keeps its source's version
    with files.open_dataset([*paths, written], allow_pickle=True) as reader:
        i = 0
        for path in [*paths, written]:
            with files.open_file(path, allow_pickle=True) as alone:
                for j in range(alone.num_batches):
                    assert_dataproto_equal(reader.read_batch(i), alone.read_batch(j))
                    i += 1
        assert i == reader.num_batches > 5
    folder = tmp_path / "folder"
    folder.mkdir()
    for path in paths:
        (folder / path.name).write_bytes(path.read_bytes())
    with files.open_dataset(folder, allow_pickle=True) as reader:
        assert len(reader.files) == 4 and len(reader.read_all()) > 0


def test_a_dataset_still_refuses_another_major_or_a_malformed_version(tmp_path):
    source = DATA / "golden-v1.3-sample.arrow"
    for version, error in ((b"2.3", adp.FormatVersionError), (b"1.x", adp.DecodeError)):
        data = source.read_bytes()
        assert data.count(b"1.3") >= 2
        other = tmp_path / f"v{version.decode()}.arrow"
        other.write_bytes(data.replace(b"\x03\x00\x00\x001.3", b"\x03\x00\x00\x00" + version))
        with pytest.raises(error):
            files.open_dataset([source, other])


# ---------------------------------------------------------------- the CLI on other tools' files, concat


def _foreign_file(path: Path, table: pa.Table, stream: bool = False) -> Path:
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(path, table.schema) as writer:
        writer.write_table(table)
    return path


_FOREIGN_COLUMNS = {
    "i64": pa.array([1, 2, 3]),
    "u64": pa.array([1, 2**63, 3], pa.uint64()),
    "f": pa.array([1.5, float("nan"), None]),
    "b": pa.array([True, None, False]),
    "map": pa.array([[("a", 1)], [("b", 2), ("c", 3)], None], pa.map_(pa.string(), pa.int64())),
    "lists": pa.array([[1], [], None], pa.list_(pa.int32())),
    "tensor": pa.FixedShapeTensorArray.from_numpy_ndarray(np.arange(12, dtype=np.float32).reshape(3, 2, 2)),
    "s": pa.array(["a", None, "c"]),
    "struct": pa.array([{"x": 1}, None, {"x": 3}]),
}


@pytest.mark.parametrize("stream", [False, True])
def test_inspect_of_another_tools_file_of_every_column_type(stream, tmp_path, capsys):
    """Round three leftovers: ``inspect --stats`` raised KeyError on an int64 column of another
    tool's file (read as a tensor, looked up among the non-tensor columns), and ``inspect``
    AttributeError on a map column (its layout looked up ``value_type``)."""
    from arrow_dataproto.cli import main

    path = _foreign_file(tmp_path / "foreign.arrow", pa.table(_FOREIGN_COLUMNS), stream)
    assert main(["inspect", str(path)]) == 0
    assert main(["inspect", "--stats", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    info = json.loads(out[out.index("{\n") :])
    stats = {c["name"]: c["stats"] for c in info["columns"]}
    assert stats["i64"] == {"min": 1.0, "mean": 2.0, "max": 3.0, "nan": 0}
    assert stats["u64"]["max"] == float(2**63)
    assert stats["f"] == {"min": 1.5, "mean": 1.5, "max": 1.5, "nan": 1}  # the null left out
    assert stats["b"] == {"min": 0.0, "mean": 0.5, "max": 1.0, "nan": 0}
    assert stats["lists"] == {"min": 1.0, "mean": 1.0, "max": 1.0, "nan": 0}
    assert stats["tensor"]["max"] == 11.0
    assert stats["map"] is stats["s"] is stats["struct"] is None
    rows = {c["name"]: c["row_lengths"] for c in info["columns"]}
    assert rows["map"] == {"min": 0, "median": 1.0, "max": 2}


def _jagged(*lengths: int, width: int | None = None) -> torch.Tensor:
    rows = [torch.arange(n * (width or 1), dtype=torch.float32).reshape((n, width) if width else (n,)) for n in lengths]
    return torch.nested.nested_tensor(rows, layout=torch.jagged)


@pytest.mark.parametrize(
    "pieces",
    [
        [_jagged(2, 3), torch.ones(2, 3)],
        [torch.ones(2, 3), _jagged(2, 3), torch.zeros(0, 5)],
        [_jagged(2, 3, width=4), torch.zeros(1, 5, 4), torch.nested.nested_tensor([torch.ones(1, 4)])],
        [torch.zeros(1, 5, 4), torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 5)])],
    ],
)
def test_concat_of_pieces_of_different_layouts(pieces):
    """Round three leftover: ``DataProto.concat`` of a jagged piece with a dense 2-D piece raised
    AttributeError ('Tensor' object has no attribute 'lengths'). The rows of every piece join
    as rows of the most general layout (jagged, else strided nested)."""
    data = [adp.DataProto.from_dict({"x": p, "y": p}) for p in pieces]
    got = adp.DataProto.concat(data).batch
    rows = [r for p in pieces for r in p.unbind()]
    assert [torch.equal(a, b) for a, b in zip(got["x"].unbind(), rows)] == [True] * len(rows) and len(got) == len(rows)
    if got["x"].layout == torch.jagged:
        assert got["x"].offsets() is got["y"].offsets()  # one ragged structure still
        assert torch.equal((got["x"] * got["y"]).values(), got["x"].values() ** 2)


@pytest.mark.parametrize("other", [torch.ones(2), torch.ones(2, 3, 5), _jagged(1, 2)])
def test_concat_of_rows_that_do_not_fit_is_the_librarys_error(other):
    first = adp.DataProto.from_dict({"x": _jagged(2, 3, width=4)})
    with pytest.raises(adp.BatchError):
        adp.DataProto.concat([first, adp.DataProto.from_dict({"x": other})])


# ---------------------------------------------------------------- nested collections under the tensordict integration


@tensorclass
class Observation:
    pixels: torch.Tensor
    step: torch.Tensor


class RolloutTD(TensorDict):
    pass


def _same_collection(a, b) -> None:
    """``b`` is ``a``: classes, stacking (stack dimension, the stacked TensorDicts), keys in order, leaves bit for bit."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        def bits(t: torch.Tensor) -> torch.Tensor:  # bit for bit (a NaN equals itself)
            return t.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)

        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))
        return
    assert a.batch_size == b.batch_size and list(a.keys()) == list(b.keys())
    if isinstance(a, LazyStackedTensorDict):
        assert a.stack_dim == b.stack_dim and len(a.tensordicts) == len(b.tensordicts)
        for x, y in zip(a.tensordicts, b.tensordicts):
            _same_collection(x, y)
        return
    for key in a.keys():
        _same_collection(a.get(key), b.get(key))


def _nested_cases() -> dict:
    some_keys = LazyStackedTensorDict(
        TensorDict({"obs": torch.ones(3), "bonus": torch.arange(2)}, []), TensorDict({"obs": torch.zeros(3)}, []), stack_dim=0
    )
    shapes = LazyStackedTensorDict(TensorDict({"v": torch.ones(2)}, []), TensorDict({"v": torch.ones(5)}, []), stack_dim=0)
    dim1 = LazyStackedTensorDict(
        TensorDict({"a": torch.ones(2, 3)}, [2]), TensorDict({"a": torch.zeros(2, 3), "b": torch.ones(2)}, [2]), stack_dim=1
    )
    t = torch.arange(2)
    return {
        "lazy stack, different keys": TensorDict({"steps": some_keys, "t": t}, [2]),
        "lazy stack, different shapes": TensorDict({"steps": shapes, "t": t}, [2]),
        "lazy stack on dim 1": TensorDict({"steps": dim1, "t": t}, [2]),
        "tensorclass": TensorDict({"obs": Observation(pixels=torch.ones(2, 2), step=t, batch_size=[2]), "t": t}, [2]),
        "subclass": TensorDict({"sub": RolloutTD({"q": torch.ones(2)}, [2]), "t": t}, [2]),
        "two levels down": TensorDict({"outer": TensorDict({"steps": some_keys}, [2]), "t": t}, [2]),
    }


@pytest.mark.parametrize("name", list(_nested_cases()))
def test_nested_collections_keep_their_class_and_stacking_under_the_tensordict_integration(name):
    """Issue 48, 2 and 3: a TensorDict holding a lazy stack came back as a plain TensorDict of the
    shared keys (the other keys dropped, stack_dim and .tensordicts lost), a nested tensorclass or
    subclass as a TensorDict, and a lazy stack of different shapes raised torch's RuntimeError from
    the serializer. ``serialize`` is what Ray calls under install()."""
    from arrow_dataproto.integrations import tensordict as adp_td

    td = _nested_cases()[name]
    back = adp_td.rebuild(pickle.loads(pickle.dumps(adp_td.serialize(td), protocol=5)))
    _same_collection(td, back)


def test_what_neither_path_serializes_is_the_librarys_error():
    from tensordict import NonTensorData

    from arrow_dataproto.integrations import tensordict as adp_td

    stack = LazyStackedTensorDict(TensorDict({"f": NonTensorData(lambda: 0)}, []), TensorDict({"g": torch.ones(1)}, []), stack_dim=0)
    with pytest.raises(adp.EncodeError, match="neither"):
        adp_td.serialize(TensorDict({"s": stack, "t": torch.arange(2)}, [2]))


def test_conjugate_and_negative_views_in_a_tensordict_are_exact():
    from arrow_dataproto.integrations import tensordict as adp_td

    z = torch.complex(torch.arange(3.0), torch.ones(3))
    td = TensorDict({"conj": z.conj(), "neg": torch._neg_view(torch.arange(3.0)), "plain": z}, [3])
    back = adp_td.rebuild(pickle.loads(pickle.dumps(adp_td.serialize(td))))
    for key in td.keys():
        assert torch.equal(back[key].resolve_conj().resolve_neg(), td[key].resolve_conj().resolve_neg())


@pytest.mark.parametrize("cut", [1, 3])
def test_a_fallback_state_cut_short_is_a_decode_error(cut):
    """Found by the fuzzer's ``views`` target: tensordict's-pickle fallback state cut to its tag
    raised IndexError from rebuild."""
    from arrow_dataproto.integrations import tensordict as adp_td

    state = adp_td.serialize(_nested_cases()["subclass"])
    with pytest.raises(adp.DecodeError):
        adp_td.rebuild(state[:cut] if cut < len(state) else (*state, b"more"))


# ---------------------------------------------------------------- the same classes, drawn (hypothesis)

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from arrow_dataproto.testing import strategies as adp_st  # noqa: E402

DRAWN = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@dataclass
class _VerlLike:
    batch: object = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return 0 if self.batch is None else self.batch.batch_size[0]


def _resolved_rows(t: torch.Tensor) -> list[torch.Tensor]:
    if t.is_nested:
        offsets, values = t.offsets(), t.values()
        return [values[int(offsets[i]) : int(offsets[i + 1])].resolve_conj().resolve_neg() for i in range(len(offsets) - 1)]
    return list(t.resolve_conj().resolve_neg().unbind())


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


@DRAWN
@given(st.integers(1, 4).flatmap(adp_st.nested_collections))
def test_drawn_nested_collections_through_the_tensordict_integration(td):
    from arrow_dataproto.integrations import tensordict as adp_td

    _same_collection(td, adp_td.rebuild(pickle.loads(pickle.dumps(adp_td.serialize(td), protocol=5))))


@DRAWN
@given(st.integers(1, 4).flatmap(lambda n: st.tuples(adp_st.conjugate_views([n]), adp_st.sliced_jagged_pairs(n))))
def test_drawn_views_and_sliced_offsets_through_every_pickle(drawn):
    from arrow_dataproto.integrations import verl as adp_verl

    view, pair = drawn
    td = TensorDict({"v": view, **pair}, batch_size=[view.shape[0]])
    adp_verl.install(_VerlLike)
    try:
        for cls in (_VerlLike, adp.DataProto):
            for protocol in (2, 5):
                back = pickle.loads(pickle.dumps(cls(td, {}, {}), protocol=protocol)).batch
                for key in td.keys():
                    got, want = _resolved_rows(back[key]), _resolved_rows(td[key])
                    assert len(got) == len(want) and all(x.dtype == y.dtype and torch.equal(_bits(x), _bits(y)) for x, y in zip(got, want))
                assert back["a"].shape == back["b"].shape  # still one ragged structure (one nested int)
    finally:
        adp_verl.uninstall(_VerlLike)


@DRAWN
@given(adp_st.evolving_plans(), st.sampled_from([{}, {"compression": "zstd"}, {"portable": True}]))
def test_drawn_rewrites_under_checksums_verify(tmp_path_factory, plan, options):
    pytest.importorskip("xxhash")
    path = tmp_path_factory.mktemp("plan") / "x.arrow"
    files.write_file(path, plan, checksums=True, **options)
    with files.open_file(path, verify=True) as reader:
        assert reader.verify() > 0
        for i, dp in enumerate(plan):
            assert_dataproto_equal(reader.read_batch(i), dp)


@DRAWN
@given(adp_st.minor_versions)
def test_drawn_minor_versions_read_as_one_dataset(tmp_path_factory, version):
    folder = tmp_path_factory.mktemp("minor")
    source = DATA / "golden-v1.3-sample.arrow"
    (folder / "a.arrow").write_bytes(source.read_bytes())
    (folder / "b.arrow").write_bytes(source.read_bytes().replace(b"\x03\x00\x00\x001.3", b"\x03\x00\x00\x00" + version.encode()))
    with files.open_dataset(folder) as reader, files.open_file(source) as alone:
        n = alone.num_batches
        for i in range(n):
            assert_dataproto_equal(reader.read_batch(i), reader.read_batch(n + i))
