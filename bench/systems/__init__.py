"""The systems the peer benchmark compares, one adapter module each."""

from __future__ import annotations

import importlib

from bench.systems.base import System

# This app first: every ratio is a peer's figure over this app's.
NAMES = ("redisqueue", "rq", "celery", "huey", "dramatiq", "arq", "saq", "taskiq", "bare")


def load(name: str) -> System:
    """The adapter of ``name`` (importing it imports that system's library)."""
    if name not in NAMES:
        raise ValueError(f"unknown system {name!r}; choose from {', '.join(NAMES)}")
    system: System = importlib.import_module(f"bench.systems.{name}").SYSTEM
    return system
