"""Adapters for frameworks that have their own DataProto class.

Each submodule imports its framework lazily, so importing it costs nothing
when the framework is absent: :mod:`arrow_dataproto.integrations.verl`.
"""
