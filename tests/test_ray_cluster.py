"""DataProto between two Ray nodes (``ray.cluster_utils.Cluster`` on this machine).

The cluster runs in a child process (this file run as a script), so that it
neither depends on nor disturbs the session's Ray instance. Each node has its
own object store, so a batch sent to the actor on the second node, and the
result coming back, cross between stores as they would between machines.
"""

from __future__ import annotations

import pytest
from two_nodes import run_as_child, two_nodes

DONE = "two-node round trip: exact both ways"


def test_dataproto_to_an_actor_on_a_second_node():
    pytest.importorskip("ray", reason="ray is not installed (pip install arrow-dataproto[ray])")
    run_as_child(__file__, DONE)


def main() -> None:
    """Start a head node and a second node with a custom resource, pin an actor
    there, and check the data the actor receives and what the driver gets back."""
    import ray
    import torch
    from arrow_dataproto.testing import assert_dataproto_equal, sample_dataproto

    def batch():  # about 1 MiB: travels through the object stores, not inlined
        return sample_dataproto(rows=64, prompt=1024, response=1024, seed=5)

    @ray.remote(num_cpus=0, resources={"second_node": 1})
    class Scorer:
        def node(self):
            return ray.get_runtime_context().get_node_id()

        def score(self, dp):
            assert_dataproto_equal(dp, batch())  # what arrived is exact
            dp.batch["row_sum"] = dp.batch["input_ids"].sum(dim=1)
            dp.meta_info["scored_on"] = ray.get_runtime_context().get_node_id()
            return dp

        def write_in_place(self, dp):
            """Copy-on-write on this node's own store: the mode, whether the tensor is a private
            view of a file this process maps shared (the store), and the write seen here."""
            from test_cow import is_private_view_of_the_store

            from arrow_dataproto import receive_mode

            private = is_private_view_of_the_store(dp.batch["input_ids"])
            dp.batch["input_ids"].add_(1)
            return receive_mode().mode, private, int(dp.batch["input_ids"][0, 0])

    with two_nodes(resources={"second_node": 1}):
        driver_node = ray.get_runtime_context().get_node_id()
        scorer = Scorer.remote()
        actor_node = ray.get(scorer.node.remote())
        assert actor_node != driver_node, "the actor should run on the second node"

        sent = batch()
        result = ray.get(scorer.score.remote(sent))
        assert result.meta_info.pop("scored_on") == actor_node
        assert torch.equal(result.batch.pop("row_sum"), sent.batch["input_ids"].sum(dim=1))
        assert_dataproto_equal(result, batch())
        assert_dataproto_equal(sent, batch())  # the driver's own data is untouched

        ref = ray.put(batch())
        first = int(batch().batch["input_ids"][0, 0])
        assert ray.get(scorer.write_in_place.remote(ref)) == ("on_write", True, first + 1)
        assert ray.get(scorer.write_in_place.remote(ref)) == ("on_write", True, first + 1)  # the object is intact
        assert_dataproto_equal(ray.get(ref), batch())
        print(DONE)


if __name__ == "__main__":
    main()
