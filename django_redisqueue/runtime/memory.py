"""How much memory this process uses, for ``runworker --max-memory``."""

from __future__ import annotations

import os
import resource
import sys

MB = 1024 * 1024


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
