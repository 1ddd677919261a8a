"""What a scheduler says when its outbox cannot be read: why, as the trouble starts
(with the command to run when the table is missing), again every REMIND_EVERY s while
it lasts, not at each relay step, and when it ends."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from django_redisqueue.backends import outbox

# How often (s) a scheduler says again that its outbox still cannot be read.
REMIND_EVERY = 300.0
OTHER_WORK = "delayed, periodic and lost jobs are handled meanwhile"


class OutboxWatch:
    """The relay steps' failures to read the outbox of ``databases``, told to
    ``logger`` by ``who`` (the scheduler)."""

    def __init__(self, logger: logging.Logger, who: str, databases: Sequence[str]) -> None:
        self.logger = logger
        self.who = who
        self.databases = databases
        self.since: float | None = None  # when the failures began (monotonic)
        self.next_report = 0.0

    def failed(self, exc: Exception) -> None:
        """A relay step could not read the outbox: ``exc``."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
        elif now < self.next_report:
            return
        self.next_report = now + REMIND_EVERY
        lasting = f" (for {now - self.since:.0f} s)" if now > self.since else ""
        missing = self._missing_tables()
        if missing:
            # A deploy's mistake, which no retry mends: an error.
            self.logger.error(
                "%s: the outbox's table is missing from database %s%s: run `%s`. Until "
                "then nothing is relayed from it and enqueue() in a transaction on it "
                "raises; %s",
                self.who,
                " and ".join(map(repr, missing)),
                lasting,
                "`, `".join(outbox.migrate_command(database) for database in missing),
                OTHER_WORK,
            )
        else:
            self.logger.warning(
                "%s: the outbox cannot be read%s: %s; %s", self.who, lasting, exc, OTHER_WORK
            )

    def succeeded(self) -> None:
        """A relay step read the outbox."""
        if self.since is not None:
            self.logger.info(
                "%s: the outbox can be read again (after %.0f s); relaying its jobs",
                self.who,
                time.monotonic() - self.since,
            )
            self.since = None

    def _missing_tables(self) -> list[str]:
        """The databases found without the outbox's table; one that cannot be read is
        not counted (the error says why)."""
        missing = []
        for database in self.databases:
            try:
                if not outbox.has_table(database):
                    missing.append(database)
            except outbox.OUTBOX_ERRORS:
                continue
        return missing
