"""Ray Data over rollout files (``arrow_dataproto.ray_data``).

The in-process tests use the session's local Ray; the two-node test runs a
``ray.cluster_utils.Cluster`` in a child process (this file run as a script), as
``test_ray_cluster.py`` does.
"""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch

pytest.importorskip("ray.data", reason="ray is not installed (pip install arrow-dataproto[ray])")

import arrow_dataproto as adp  # noqa: E402
from arrow_dataproto import files  # noqa: E402
from arrow_dataproto.testing import assert_dataproto_equal, sample_dataproto  # noqa: E402
from two_nodes import run_as_child, two_nodes  # noqa: E402

DONE = "two-node Ray Data read: exact, both nodes read"


def batches(n: int = 3, rows: int = 16) -> list[adp.DataProto]:
    out = []
    for step in range(n):
        dp = sample_dataproto(rows=rows, prompt=8, response=8, seed=step)
        dp.meta_info["step"] = step
        out.append(dp)
    return out


@pytest.fixture(scope="module", autouse=True)
def ordered():
    """Blocks in the order of the record batches (Ray Data may reorder them otherwise)."""
    import ray.data

    options = ray.data.DataContext.get_current().execution_options
    before, options.preserve_order = options.preserve_order, True
    yield
    options.preserve_order = before


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("rollouts")
    parts = batches()
    files.write_file(path / "a.arrow", parts[:2])
    files.write_file(path / "b.arrow", parts[2:])
    return path


def scorer():
    """The map_batches function, made inside the test: Ray ships it by value (the workers
    cannot import this test module)."""

    def add_score(table):
        dp = adp.ray_data.to_dataproto(table)
        dp.batch["score"] = dp.batch["extra"]["values"].sum(dim=-1)
        return adp.ray_data.from_dataproto(dp)

    return add_score


def test_one_block_per_record_batch_each_decodes_to_its_batch(ray_session, folder):
    ray = ray_session
    ds = adp.ray_data.read_files(folder)
    tables = ray.get(ds.to_arrow_refs())
    assert [t.num_rows for t in tables] == [16, 16, 16]
    got = [adp.ray_data.to_dataproto(t) for t in tables]
    for dp, expected in zip(got, batches()):
        assert_dataproto_equal(dp, expected)  # meta_info of its own record batch included


def test_columns_are_read_alone_and_the_tree_follows(ray_session, folder):
    ray = ray_session
    ds = adp.ray_data.read_files(folder, columns=["extra", "uid"])
    assert ds.schema().names == ["extra.values", "uid"]
    table = ray.get(ds.to_arrow_refs())[0]
    assert json.loads(table.schema.metadata[b"adp.tree"]) == [["extra", [16], None, ["values"]]]
    dp = adp.ray_data.to_dataproto(table)
    expected = batches()[0]
    assert torch.equal(dp.batch["extra"]["values"], expected.batch["extra"]["values"])
    assert list(dp.non_tensor_batch) == ["uid"]
    assert list(dp.batch.keys()) == ["extra"]


def test_select_columns_is_pushed_into_the_read(ray_session, folder):
    """Projection pushdown: the blocks come out of the read task with only the selected
    columns and a tree trimmed to them (a projection applied after the read would leave
    the file's whole tree in the metadata)."""
    ray = ray_session
    table = ray.get(adp.ray_data.read_files(folder).select_columns(["input_ids"]).to_arrow_refs())[0]
    assert table.column_names == ["input_ids"]
    assert json.loads(table.schema.metadata[b"adp.tree"]) == ["input_ids"]


def test_map_batches_with_to_dataproto_and_back(ray_session, folder):
    ray = ray_session
    ds = adp.ray_data.read_files(folder).map_batches(scorer(), batch_format="pyarrow", batch_size=None)
    out = [adp.ray_data.to_dataproto(t) for t in ray.get(ds.to_arrow_refs())]
    for dp, expected in zip(out, batches()):
        score = dp.batch.pop("score")
        assert torch.equal(score, expected.batch["extra"]["values"].sum(dim=-1))
        assert_dataproto_equal(dp, expected)


def test_batches_that_cut_blocks_take_their_rows(ray_session, folder):
    """Ray re-batches blocks (here at most 10 rows at a time out of 16-row blocks): each call
    gets a DataProto of the rows it holds, whatever the file's batch size says."""
    ray = ray_session

    def count_rows(table):
        dp = adp.ray_data.to_dataproto(table)
        dp.batch["rows_in_call"] = torch.full((len(dp),), len(dp))
        dp.batch["score"] = dp.batch["extra"]["values"].sum(dim=-1)
        return adp.ray_data.from_dataproto(dp)

    ds = adp.ray_data.read_files(folder).map_batches(count_rows, batch_format="pyarrow", batch_size=10)
    out = [adp.ray_data.to_dataproto(t) for t in ray.get(ds.to_arrow_refs())]
    whole = adp.DataProto.concat(out, meta_info="update")
    expected = adp.DataProto.concat(batches(), meta_info="update")
    assert len(whole) == len(expected) == 48
    sizes = set(whole.batch["rows_in_call"].tolist())
    assert 10 in sizes and max(sizes) == 10 and len(sizes) > 1
    assert torch.equal(whole.batch["score"], expected.batch["extra"]["values"].sum(dim=-1))
    assert torch.equal(whole.batch["input_ids"], expected.batch["input_ids"])
    assert list(whole.non_tensor_batch["uid"]) == list(expected.non_tensor_batch["uid"])


def test_unknown_column_is_refused_on_the_driver(folder):
    with pytest.raises(adp.ColumnNotFoundError, match="nope"):
        adp.ray_data.read_files(folder, columns=["nope"])


def test_to_dataproto_wants_the_pyarrow_batch_format():
    with pytest.raises(adp.ArgumentTypeError, match="batch_format='pyarrow'"):
        adp.ray_data.to_dataproto({"input_ids": [[1, 2]]})


def test_the_datasource_holds_no_data(folder, tmp_path):
    """The driver reads footers only: the datasource shipped to every read task is a few
    paths and counts, the same size for a file a hundred times larger."""
    big = tmp_path / "big.arrow"
    files.write_file(big, [sample_dataproto(rows=1024, prompt=64, response=64, seed=1)])
    small = tmp_path / "small.arrow"
    files.write_file(small, [sample_dataproto(rows=8, prompt=8, response=8, seed=1)])
    sizes = [len(pickle.dumps(adp.ray_data.DataProtoDatasource(p))) for p in (big, small)]
    assert os.path.getsize(big) > 100 * os.path.getsize(small)
    assert abs(sizes[0] - sizes[1]) < 64 and max(sizes) < 16 * 1024


def test_blocks_across_two_nodes():
    run_as_child(__file__, DONE)


def main() -> None:
    """A head node and a second node, one CPU each; four record batches in two files read
    by Ray Data. Every block is exact, and the reads ran on both nodes."""
    import tempfile

    import ray
    import ray.data

    with two_nodes():
        ray.data.DataContext.get_current().execution_options.preserve_order = True
        folder = tempfile.mkdtemp()
        parts = batches(4, rows=32)
        files.write_file(os.path.join(folder, "a.arrow"), parts[:2])
        files.write_file(os.path.join(folder, "b.arrow"), parts[2:])

        def tag(table):
            dp = adp.ray_data.to_dataproto(table)
            dp.meta_info["node"] = ray.get_runtime_context().get_node_id()
            return adp.ray_data.from_dataproto(dp)

        ds = adp.ray_data.read_files(folder).map_batches(tag, batch_format="pyarrow", batch_size=None)
        got = [adp.ray_data.to_dataproto(t) for t in ray.get(ds.to_arrow_refs())]
        nodes = {dp.meta_info.pop("node") for dp in got}
        assert len(got) == 4
        for dp, expected in zip(got, parts):
            assert_dataproto_equal(dp, expected)
        assert len(nodes) == 2, f"the reads ran on {len(nodes)} node(s)"
        print(DONE)


if __name__ == "__main__":
    main()
