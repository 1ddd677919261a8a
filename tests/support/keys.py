"""The keys of the test settings' backends, named as the app names them
(``django_redisqueue/store/keys.py``): tests read and write Redis through these, never
through key names spelled out."""

from django_redisqueue.compat import task_backends

DEFAULT_KEYS = task_backends["default"].keys
LEASED_KEYS = task_backends["leased"].keys
PERIODIC_KEYS = task_backends["periodic"].keys
CACHED_KEYS = task_backends["cached"].keys
ANYQUEUE_KEYS = task_backends["anyqueue"].keys
