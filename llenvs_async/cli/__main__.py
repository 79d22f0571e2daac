"""``python -m llenvs_async.cli``: the same as the ``llenvs-async`` console script."""

from __future__ import annotations

from . import main

main()
