"""A Harbor task family where credit assignment matters: the "relay" tasks, built locally.

Each task's container holds one file, ``/app/w/<name>.src``; the goal is ``/app/w/<name>.out``
with the same content and no other file in ``/app/w``. The agent has three fixed commands
(listed in the instruction; ``$F`` is the task's name, set in the image) and four actions:

- ``cp $F.src $F.tmp; ls``  (make a working copy)
- ``mv $F.tmp $F.out; ls``  (publish the copy)
- ``rm $F.src; ls``         (remove the original)

The order copy, publish, remove succeeds; copy, remove, publish too. Removing the original
first destroys the only copy: the episode can never succeed, though it runs on. A command
that fails (publishing with no copy) wastes an action but is recoverable while actions
remain. The reward is the verifier's, at the end only. A uniformly random policy succeeds
with probability 13/81 = 0.16 (see ``chance_success``).

Train and held-out splits differ in the file name, which appears in the instruction and in
every listing: the held-out split tests generalisation over names never seen in training,
within the same structure (nothing more).

    python examples/agent_tasks.py DIR     # writes DIR/train and DIR/heldout
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

COMMANDS = ("cp $F.src $F.tmp; ls", "mv $F.tmp $F.out; ls", "rm $F.src; ls")
MAX_ACTIONS = 4
TRAIN_NAMES = ("amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "harbor")
HELDOUT_NAMES = ("ivory", "jasper", "koala", "lemon")

_TOML = """\
schema_version = "1.4"

[task]
name = "llenvs-examples/relay-{name}"
description = "Copy, publish and clean up one file, in an order that keeps a copy."

[agent]
timeout_sec = 120.0

[verifier]
timeout_sec = 30.0

[environment]
build_timeout_sec = 120.0
workdir = "/app/w"
cpus = 1
memory_mb = 256
network_mode = "no-network"
"""

_DOCKERFILE = """\
FROM debian:bookworm-slim
ENV F={name}
WORKDIR /app/w
RUN printf '%s\\n' '{content}' > /app/w/{name}.src
"""

_TEST = """\
#!/bin/bash
# Verifier of relay-{name}: /app/w holds exactly {name}.out, with the original content.
mkdir -p /logs/verifier
if [ "$(ls -A /app/w)" = "{name}.out" ] && [ "$(cat /app/w/{name}.out)" = '{content}' ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
"""


def instruction(name: str) -> str:
    """The task's instruction: the goal, the three commands and the starting listing."""
    listed = "\n".join(COMMANDS)
    return (
        f"F={name}. Make /app/w/$F.out a copy of $F.src and leave no other file in /app/w.\n"
        f"Call bash with one of these commands:\n{listed}\n"
        f"Files now:\n{name}.src\n"
    )


def write_task(root: Path, name: str) -> Path:
    """Write the Harbor task ``relay-<name>`` under ``root`` and return its directory."""
    content = f"the {name} record"
    task = root / f"relay-{name}"
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text(_TOML.format(name=name))
    (task / "instruction.md").write_text(instruction(name))
    (task / "environment" / "Dockerfile").write_text(_DOCKERFILE.format(name=name, content=content))
    (task / "tests" / "test.sh").write_text(_TEST.format(name=name, content=content))
    solve = "#!/bin/bash\ncd /app/w\n" + "\n".join(COMMANDS) + "\n"
    (task / "solution" / "solve.sh").write_text(solve)
    return task


def build_tasks(root: str | Path) -> tuple[Path, Path]:
    """Write the train and held-out splits under ``root``; returns their directories."""
    base = Path(root)
    splits = []
    for split, names in (("train", TRAIN_NAMES), ("heldout", HELDOUT_NAMES)):
        for name in names:
            write_task(base / split, name)
        splits.append(base / split)
    return splits[0], splits[1]


Files = frozenset[str]  # the extensions present in /app/w: "src", "tmp", "out"
START: Files = frozenset({"src"})


INPUTS = ("src", "tmp", "src")  # the file each command needs: without it, the command fails


def apply(files: Files, command: int) -> Files:
    """The files after one command (the container's rule, in Python); a command that fails
    (publishing with no copy, removing what is gone) changes nothing."""
    if INPUTS[command] not in files:
        return files
    if command == 0:
        return files | {"tmp"}
    if command == 1:
        return (files - {"tmp"}) | {"out"}
    return files - {"src"}


def succeeds(choices: tuple[int, ...]) -> bool:
    """Whether a sequence of command indices solves a task (the verifier's rule, in Python)."""
    files = START
    for c in choices:
        files = apply(files, c)
    return files == {"out"}


def chance_success(actions: int = MAX_ACTIONS) -> float:
    """Success probability of a policy picking uniformly among the commands."""
    seqs = list(itertools.product(range(len(COMMANDS)), repeat=actions))
    return sum(succeeds(s) for s in seqs) / len(seqs)


def reachable(actions: int = MAX_ACTIONS) -> list[Files]:
    """Every file set an episode can show before its last action, in a stable order."""
    seen, frontier = [START], [START]
    for _ in range(actions - 1):
        frontier = [apply(f, c) for f in frontier for c in range(len(COMMANDS))]
        seen += [f for f in dict.fromkeys(frontier) if f not in seen]
    return seen


def listing_of(name: str, files: Files) -> str:
    """The files as ``ls`` lists them in the task's container ("(none)" for none)."""
    return "\n".join(f"{name}.{ext}" for ext in sorted(files)) or "(none)"


def files_shown(prompt: str) -> Files:
    """The file set a prompt's listing (after "Files now:") shows: ``listing_of`` undone."""
    shown = prompt.partition("Files now:\n")[2].splitlines()
    return frozenset(f.rpartition(".")[2] for f in shown if f and f != "(none)")


def expected_success(
    choice: dict[Files, tuple[float, ...]], actions: int = MAX_ACTIONS, start: Files = START
) -> float:
    """Exact success probability, from ``start`` with ``actions`` left, of a policy that,
    seeing ``files``, runs command ``c`` with probability ``choice[files][c]``; the rest of
    the mass (a reply that is none of the listed calls) wastes the action, as a malformed
    call does."""

    def value(files: Files, left: int) -> float:
        if left == 0 or files == {"out"}:  # a solved task stays solved: every command fails
            return float(files == {"out"})
        probs = choice[files]
        stay = 1.0 - sum(probs)
        after = sum(p * value(apply(files, c), left - 1) for c, p in enumerate(probs))
        return after + stay * value(files, left - 1)

    return value(start, actions)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/agent_tasks.py DIR")
    train, heldout = build_tasks(sys.argv[1])
    print(f"wrote {train} and {heldout}; chance success {chance_success():.3f}")
