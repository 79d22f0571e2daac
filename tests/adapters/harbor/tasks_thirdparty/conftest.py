"""Harbor task directories: their tests/*.py run inside task containers, never here."""

collect_ignore_glob = ["*"]
