"""The task format: task directories, ``task.toml``, compose files, datasets and the registry."""
