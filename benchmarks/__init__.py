"""Benchmarks of llenvs-async against the seed's threaded design and physical limits.

Run them all with ``python -m benchmarks.run_all`` (``make bench``); results land in
``benchmarks/results/`` as JSON, PNG plots and ``RESULTS.md``.
"""
