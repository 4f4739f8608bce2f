"""The shared test helpers now live in :mod:`arrow_dataproto.testing`; import them from there.

This module only re-exports them for test modules not yet moved over.
"""

from arrow_dataproto.testing import (  # noqa: F401
    assert_dataproto_equal,
    assert_td_equal,
    assert_tensor_equal,
    sample_dataproto,
    strict_equal,
)
