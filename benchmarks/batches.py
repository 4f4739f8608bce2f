"""The benchmark batches: :mod:`arrow_dataproto.testing.samples`, under the name the scripts here use."""

from arrow_dataproto.testing.samples import jagged_batch, nbytes, ppo_batch, seed_batch  # noqa: F401
