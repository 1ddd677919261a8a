"""A running job's progress: how much of its work is done, of how much, and a short
note, as its task reports it (``context.set_progress``) and any process reads it back
(``result.progress``). Stored on the job, in its ``progress`` field, as JSON that names
the attempt it belongs to: a retry starts with none."""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

# The longest note kept: a longer one is cut, so that a job's size stays bounded.
MAX_NOTE_CHARS = 200
# A process writes its jobs' progress at most this often (seconds), however often their
# tasks report it: the last value reported is the one written.
WRITE_INTERVAL = 0.25


@dataclass(frozen=True, slots=True)
class JobProgress:
    """What a task reported last: ``done`` of ``total`` (None: unknown) and a note."""

    done: int | float
    total: int | float | None = None
    note: str = ""

    @classmethod
    def checked(cls, done: Any, total: Any = None, note: Any = "") -> JobProgress:
        """The progress a task reports, once its values are numbers and text; a long
        note is cut to ``MAX_NOTE_CHARS``."""
        done = _amount("done", done)
        if total is not None:
            total = _amount("total", total)
        if not isinstance(note, str):
            raise TypeError(f"A progress note is text; got {type(note).__name__}.")
        # A lone surrogate (an undecodable file name) could not be sent as UTF-8.
        note = note[:MAX_NOTE_CHARS].encode("utf-8", "backslashreplace").decode("utf-8")
        return cls(done, total, note)

    @property
    def fraction(self) -> float | None:
        """``done`` over ``total``, between 0 and 1; None without a total."""
        if not self.total:
            return None if self.total is None else 1.0
        return min(max(self.done / self.total, 0.0), 1.0)

    @property
    def percent(self) -> int | None:
        fraction = self.fraction
        return None if fraction is None else int(fraction * 100)

    def record(self, attempt: int) -> str:
        """As stored on the job, for its attempt number ``attempt``."""
        values = {"attempt": attempt, "done": self.done, "total": self.total, "note": self.note}
        return json.dumps(values, separators=(",", ":"))


def read_progress(record: str | None, attempt: int) -> JobProgress | None:
    """The progress a job's ``progress`` field holds for its attempt ``attempt``, or
    None: none reported, another attempt's, or a field that is not a progress record
    (whatever it holds, reading never raises)."""
    if not record:
        return None
    try:
        values = json.loads(record)
    except (ValueError, RecursionError):
        return None
    if not isinstance(values, dict) or values.get("attempt") != attempt:
        return None
    try:
        return JobProgress.checked(values.get("done"), values.get("total"), values.get("note", ""))
    except (TypeError, ValueError):
        return None


def summed(progresses: list[JobProgress | None]) -> JobProgress | None:
    """The progress of several jobs as one (a group's): their amounts added, a total
    only when each has one; None when none reported any."""
    reported = [progress for progress in progresses if progress is not None]
    if not reported:
        return None
    totals = [progress.total for progress in reported]
    total = None if any(t is None for t in totals) else sum(t for t in totals if t is not None)
    return JobProgress(sum(progress.done for progress in reported), total)


def _amount(name: str, value: Any) -> int | float:
    """``value`` as an int or a float, once it is a real number, finite, 0 or more."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Decimal)):
        raise TypeError(f"Progress {name} is a number; got {type(value).__name__}.")
    try:
        amount = int(value) if isinstance(value, numbers.Integral) else float(value)
        finite = math.isfinite(amount)  # an int past a float's range: OverflowError
    except (OverflowError, ValueError):
        finite = False
    if not finite or amount < 0:
        raise ValueError(f"Progress {name} is a finite number, 0 or more; got {value!r:.80}.")
    return amount
