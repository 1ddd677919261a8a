"""What the protocol model's rules draw from. Jobs and workers are picked by index in
lists the model keeps in a stable order (PICK modulo the length)."""

from __future__ import annotations

from hypothesis import strategies as st

from tests.support.model.protocol.records import (
    LIMITS,
    ORDERS,
    PRIORITIES,
    QUEUES,
    RETRY_IN,
    STATUSES,
    UNIQUE_KEYS,
    WORKERS,
)

# Jobs go to "default" at priority 0 more often than elsewhere: FIFO is a promise
# among equal priorities of one queue, so it needs jobs that share both.
JOB_QUEUE = st.sampled_from(["default", "default", "high", "low"])
PRIORITY = st.sampled_from([0, 0, *PRIORITIES])
STATUS = st.sampled_from(STATUSES)
RETRY_DELAY = st.sampled_from(RETRY_IN)
PICK = st.integers(0, 1 << 16)
WORKER = st.sampled_from(WORKERS)
SLOTS = st.tuples(*[st.integers(1, 3)] * len(WORKERS))  # per worker, in WORKERS' order
ORDER = st.just(QUEUES) | st.sampled_from(ORDERS)  # all queues, in order, half the time
WRONG = st.sampled_from(["stale", "last claim's", "other worker", "made up", "empty"])
# What a linked job waits for: nothing, the job before it in the call, a job of the
# model (any state, deleted ones too), or a job that never existed.
LINK = st.sampled_from(["prev", "prev", "prev", "prev", "none", "job", "job", "unknown"])
MEMBER_LINK = st.sampled_from(["none", "none", "none", "none", "none", "job", "prev", "unknown"])
# Not SOON: let_time_pass would sleep for each such waiting job (plain enqueues and
# retries cover the due times real time reaches).
LINKED_DELAY = st.sampled_from(["now", "now", "past", "an hour"])
LINKED = st.tuples(JOB_QUEUE, PRIORITY, LINKED_DELAY, LINK, PICK)
MEMBER = st.tuples(JOB_QUEUE, PRIORITY, LINKED_DELAY, MEMBER_LINK, PICK)
BROADCAST_QUEUE = st.sampled_from(["", "", *QUEUES])

# Jobs with options go mostly to one queue and priority, so that limited jobs queue
# behind each other, and a parked job has jobs behind it to take.
OPTION_QUEUE = st.sampled_from(["default", "default", "default", "high", "low"])
OPTION_PRIORITY = st.sampled_from([0, 0, 0, 5, -100])
# Not SOON: real time reaching a due time is covered by the plain enqueues.
OPTION_DELAY = st.sampled_from(["now", "now", "now", "past", "an hour"])
UNIQUE = st.none() | st.tuples(st.sampled_from(UNIQUE_KEYS), st.booleans())
LIMIT = st.none() | st.sampled_from(sorted(LIMITS))
OPTIONED = st.tuples(OPTION_QUEUE, OPTION_PRIORITY, OPTION_DELAY, UNIQUE, LIMIT)
LIMITED_STEP = st.tuples(
    OPTION_QUEUE, OPTION_PRIORITY, st.sampled_from(["now", "now", "an hour"]), LIMIT
)
