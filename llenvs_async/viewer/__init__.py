"""The browser viewer behind ``llenvs-async view``: run lists, trajectories and value trees.

``model`` reads results JSONL and ``q-values --json`` files into one JSON document, ``page``
renders the page (vanilla JS and CSS shipped as package data, inlined), ``server`` serves it
on 127.0.0.1. Submodules are imported on use, so ``llenvs_async.cli`` stays light.
"""
