"""The benchmark batches live in :mod:`arrow_dataproto.samples`; this name is kept for the scripts here."""

from arrow_dataproto.samples import jagged_batch, nbytes, ppo_batch, seed_batch  # noqa: F401
