"""Counts live instances and concurrent operations, for tests and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["InstanceTracker"]


@dataclass(slots=True)
class InstanceTracker:
    """Mutable counters shared by the instances of one environment family.

    ``peak_*`` are high-water marks: structural facts tests can assert on
    (e.g. "all B restores were in flight together"), unlike wall-clock times.
    """

    created: int = 0
    closed: int = 0
    live: int = 0
    peak_live: int = 0
    in_reset: int = 0
    peak_in_reset: int = 0
    in_step: int = 0
    peak_in_step: int = 0
    resets: int = 0
    steps: int = 0
    events: list[tuple[str, int]] = field(default_factory=list)

    def opened(self) -> None:
        self.created += 1
        self.live += 1
        self.peak_live = max(self.peak_live, self.live)

    def closed_one(self) -> None:
        self.closed += 1
        self.live -= 1

    def enter(self, what: str, ident: int) -> None:
        self.events.append((f"{what}-start", ident))
        if what == "reset":
            self.resets += 1
            self.in_reset += 1
            self.peak_in_reset = max(self.peak_in_reset, self.in_reset)
        else:
            self.steps += 1
            self.in_step += 1
            self.peak_in_step = max(self.peak_in_step, self.in_step)

    def leave(self, what: str, ident: int) -> None:
        self.events.append((f"{what}-end", ident))
        if what == "reset":
            self.in_reset -= 1
        else:
            self.in_step -= 1
