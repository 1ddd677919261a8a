"""The task backends: what a job goes through from ``enqueue()`` until it is stored.

``base`` checks a job and gives it its id and envelope (both backends); ``redis`` sends
it to Redis and reads it back; ``outbox`` keeps it in a database table until the
transaction commits; ``immediate`` runs it at once, for tests. Settings name them by
their public paths, ``django_redisqueue.backend`` and ``django_redisqueue.immediate``.
"""
