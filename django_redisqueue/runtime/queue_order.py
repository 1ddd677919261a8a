"""The order in which a worker tries its queues."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence


class QueueOrder:
    """The order in which a worker tries its queues on each claim.

    Strict (no weights): always the configured order, so a busy first queue starves
    the others. Weighted: a smooth weighted round-robin picks the queue tried first
    (``high:5 low:1`` puts ``low`` first once in six claims); the rest follow in the
    configured order, so no job waits for ever while work remains anywhere.
    """

    def __init__(self, queues: Sequence[str], weights: Mapping[str, int] | None = None):
        self.queues = list(queues)
        self.weights = dict(weights or {})
        self._current = dict.fromkeys(self.queues, 0)
        self._turn = threading.Lock()  # a slot worker's threads claim side by side

    def next(self) -> list[str]:
        """The queue order for the next claim."""
        if not self.weights:
            return self.queues
        with self._turn:
            total = 0
            for queue in self.queues:
                weight = self.weights.get(queue, 1)
                self._current[queue] += weight
                total += weight
            first = max(self.queues, key=self._current.__getitem__)
            self._current[first] -= total
        return [first, *(q for q in self.queues if q != first)]
