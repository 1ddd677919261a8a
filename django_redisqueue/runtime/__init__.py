"""The processes that run jobs: the worker, the scheduler, the pool that supervises
workers, code reloading and memory limits."""

# The worker's logger, which its heartbeat and broadcasts log to as well: what a worker
# does is routed, or silenced, by this one name.
WORKER_LOGGER = "django_redisqueue.runtime.worker"

# The scheduler's longest sleep when nothing is due (s): also how often an idle
# scheduler steps, and so checks in (scheduler.py). Workers judge by it whether a
# scheduler runs.
SCHEDULER_IDLE_WAIT = 3.0
