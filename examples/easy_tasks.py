"""A Harbor task family at the level of "create this file / count these lines", built locally.

Six kinds of one-command task (write a line to a file, make a directory, count a file's lines,
copy, delete, rename a file), each instantiated with a name: the train split uses some names,
the held-out split others, so a held-out score measures tasks never tuned on. Every task is
solved by one shell command followed by a submit; the reward is the verifier's, 0 or 1.

    python examples/easy_tasks.py DIR     # writes DIR/train and DIR/heldout
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

TRAIN_NAMES = ("amber", "birch")
HELDOUT_NAMES = ("cedar", "delta")
WORDS = {"amber": "sunrise", "birch": "harvest", "cedar": "meadow", "delta": "lantern"}
LINES = {"amber": 7, "birch": 4, "cedar": 5, "delta": 9}

_TOML = """\
schema_version = "1.4"

[task]
name = "llenvs-examples/easy-{kind}-{name}"
description = "{description}"

[agent]
timeout_sec = 120.0

[verifier]
timeout_sec = 30.0

[environment]
build_timeout_sec = 120.0
workdir = "/app"
cpus = 1
memory_mb = 256
network_mode = "no-network"
"""


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of task: its instruction, starting files, solution and check, per name."""

    key: str
    description: str
    instruction: str  # formatted with name, word, lines
    setup: str  # Dockerfile RUN line (empty: none)
    solution: str
    check: str  # a bash condition, true when solved


KINDS = (
    Kind(
        "write",
        "Create a file holding one given line.",
        "Create the file /app/{name}.txt containing exactly one line: {word}",
        "",
        "echo {word} > /app/{name}.txt",
        '[ "$(cat /app/{name}.txt 2>/dev/null)" = "{word}" ]',
    ),
    Kind(
        "mkdir",
        "Create a directory.",
        "Create a directory named /app/{name}",
        "",
        "mkdir /app/{name}",
        "[ -d /app/{name} ]",
    ),
    Kind(
        "count",
        "Count the lines of a file.",
        "The file /app/{name}.log has some lines. Write the number of lines in it "
        "to the file /app/count.txt",
        "RUN seq 1 {lines} | sed 's/^/entry /' > /app/{name}.log",
        "wc -l < /app/{name}.log > /app/count.txt",
        '[ "$(tr -d " \\n" < /app/count.txt 2>/dev/null)" = "{lines}" ]',
    ),
    Kind(
        "copy",
        "Copy a file.",
        "Copy the file /app/{name}.src to /app/{name}.bak",
        "RUN echo 'the {name} record' > /app/{name}.src",
        "cp /app/{name}.src /app/{name}.bak",
        "cmp -s /app/{name}.src /app/{name}.bak",
    ),
    Kind(
        "remove",
        "Delete a file.",
        "Delete the file /app/{name}.tmp",
        "RUN echo scratch > /app/{name}.tmp && echo keep > /app/keep.txt",
        "rm /app/{name}.tmp",
        "[ ! -e /app/{name}.tmp ] && [ -f /app/keep.txt ]",
    ),
    Kind(
        "rename",
        "Rename a file.",
        "Rename the file /app/{name}.old to /app/{name}.new",
        "RUN echo 'the {name} notes' > /app/{name}.old",
        "mv /app/{name}.old /app/{name}.new",
        '[ ! -e /app/{name}.old ] && [ "$(cat /app/{name}.new 2>/dev/null)" = "the {name} notes" ]',
    ),
)


def write_task(root: Path, kind: Kind, name: str) -> Path:
    """Write the Harbor task ``easy-<kind>-<name>`` under ``root`` and return its directory."""
    fields = {"name": name, "word": WORDS[name], "lines": LINES[name]}
    task = root / f"easy-{kind.key}-{name}"
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text(
        _TOML.format(kind=kind.key, name=name, description=kind.description)
    )
    (task / "instruction.md").write_text(kind.instruction.format(**fields) + "\n")
    setup = kind.setup.format(**fields)
    dockerfile = "FROM debian:bookworm-slim\nWORKDIR /app\n" + (setup + "\n" if setup else "")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    check = kind.check.format(**fields)
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        f"if {check}; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
    )
    (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{kind.solution.format(**fields)}\n")
    return task


def build_tasks(root: str | Path) -> tuple[Path, Path]:
    """Write the train and held-out splits under ``root``; returns their directories."""
    base = Path(root)
    splits = []
    for split, names in (("train", TRAIN_NAMES), ("heldout", HELDOUT_NAMES)):
        for name in names:
            for kind in KINDS:
                write_task(base / split, kind, name)
        splits.append(base / split)
    return splits[0], splits[1]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/easy_tasks.py DIR")
    train, heldout = build_tasks(sys.argv[1])
    print(f"wrote {len(KINDS) * len(TRAIN_NAMES)} tasks to {train}, "
          f"{len(KINDS) * len(HELDOUT_NAMES)} to {heldout}")  # fmt: skip
