"""How much memory this process uses, for ``runworker --max-memory``."""

from __future__ import annotations

import logging
import os
import resource
import sys

from django_redisqueue.runtime import WORKER_LOGGER

logger = logging.getLogger(WORKER_LOGGER)

MB = 1024 * 1024


def past_limit(limit_mb: int | None, worker_id: str) -> bool:
    """Whether worker ``worker_id`` has grown past ``--max-memory`` (MB of RSS; None:
    no limit), said in the log: it then exits to be replaced."""
    if limit_mb is None:
        return False
    rss = resident_set_size()
    if rss <= limit_mb * MB:
        return False
    logger.warning(
        "Worker %s: RSS %d MB over --max-memory %d MB; exiting to be replaced",
        worker_id,
        rss // MB,
        limit_mb,
    )
    return True


def resident_set_size() -> int:
    """This process's resident set size (RSS) in bytes, now.

    Linux: the resident pages of ``/proc/self/statm`` times the page size. Elsewhere, or
    without /proc: the peak RSS from ``getrusage`` (``ru_maxrss``), which never falls,
    so a process that once went past a limit stays past it.
    """
    try:
        with open("/proc/self/statm", "rb") as statm:
            resident_pages = int(statm.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # Bytes on macOS, kibibytes on Linux and the BSDs.
        return peak if sys.platform == "darwin" else peak * 1024
