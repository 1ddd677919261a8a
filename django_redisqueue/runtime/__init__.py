"""The processes that run jobs: the worker, the scheduler, the pool that supervises
workers, code reloading and memory limits."""
