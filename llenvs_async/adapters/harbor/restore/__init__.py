"""Restoring a saved state of a Harbor episode: replay (``harbor_restore``), snapshot forks, and
the check that a replay reproduces the container."""
