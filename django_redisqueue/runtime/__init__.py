"""The processes that run jobs: the worker, the scheduler, the pool that supervises
workers, code reloading and memory limits."""

# The worker's logger, which its heartbeat and broadcasts log to as well: what a worker
# does is routed, or silenced, by this one name.
WORKER_LOGGER = "django_redisqueue.runtime.worker"

# The scheduler's longest sleep when nothing is due (s): also how often an idle
# scheduler steps, and so checks in (scheduler.py). No longer than the hand-off's
# deadline (store/broker.py's HANDED_MS, held to it by a test), so that a job handed
# to a dead worker goes back on time with no wake-up at each hand-off. Workers judge by
# it whether a scheduler runs.
SCHEDULER_IDLE_WAIT = 1.0
