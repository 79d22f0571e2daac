"""``python -m llenvs_async.docker build-base|build-busybox``: build the local images."""

from __future__ import annotations

import sys

from .images import main

if __name__ == "__main__":
    sys.exit(main())
