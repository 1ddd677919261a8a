"""The processes that run jobs: the worker, the scheduler, the pool that supervises
workers, code reloading and memory limits."""

# The worker's logger, which its heartbeat and broadcasts log to as well: what a worker
# does is routed, or silenced, by this one name.
WORKER_LOGGER = "django_redisqueue.runtime.worker"
