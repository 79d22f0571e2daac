"""Small environments for examples, tests and benchmarks: two pure, one stateful."""

from __future__ import annotations

from ._tracker import InstanceTracker
from .arithmetic import ArithmeticEnv
from .chain import ChainEnv
from .counter import CounterEnv

__all__ = ["ArithmeticEnv", "ChainEnv", "CounterEnv", "InstanceTracker"]
