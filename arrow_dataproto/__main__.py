"""``python -m arrow_dataproto``: the ``arrow-dataproto`` command (see :mod:`arrow_dataproto.cli`)."""

from .cli import main

raise SystemExit(main())
