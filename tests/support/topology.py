"""Which Redis the tests run on: one server; or (``REDISQUEUE_TEST_TOPOLOGY=cluster``)
a Redis Cluster of 3 masters and 3 replicas, on which each backend's keys live on one
slot. Which server program (``REDISQUEUE_TEST_SERVER``: Redis 6.2, without Redis
Functions, on which the scripts are called by EVALSHA; Valkey 8.1) is
``tests/support/servers.py``'s choice. Shared by the test process and the workers it
starts."""

import os

import redis
from redis.cluster import RedisCluster

from tests.support.servers import SERVER_ENV

ON_CLUSTER = os.environ.get("REDISQUEUE_TEST_TOPOLOGY") == "cluster"
WITHOUT_FUNCTIONS = os.environ.get(SERVER_ENV) == "redis-6.2"
# A Redis 7 with Functions renamed away, as some hosted services run it: it answers
# FCALL and FUNCTION as unknown commands, in its own words (not 6.2's).
NO_FUNCTIONS = ("--rename-command", "FCALL", "", "--rename-command", "FCALL_RO", "")
NO_FUNCTIONS += ("--rename-command", "FUNCTION", "")
# Set, for this process and the ones it starts, while the URL in use names a cluster node.
CLUSTER_ENV = "REDISQUEUE_TEST_CLUSTER"


def make_client(url: str, **kwargs) -> redis.Redis | RedisCluster:
    """A client of the Redis at ``url``: a cluster client while the tests use a cluster."""
    if os.environ.get(CLUSTER_ENV):
        return RedisCluster.from_url(url, **kwargs)
    return redis.Redis.from_url(url, **kwargs)


def keys_server(client: redis.Redis | RedisCluster, key: str = "") -> redis.Redis:
    """The server that holds ``key`` (by default the default backend's keys): ``client``
    itself, or on a cluster the master of the key's slot, for what is counted per
    server (INFO, CLIENT LIST)."""
    if isinstance(client, RedisCluster):
        if not key:
            from tests.support.keys import DEFAULT_KEYS  # Django's settings are read by now

            key = DEFAULT_KEYS.prefix
        node = client.get_node_from_key(key)
        return node.redis_connection or client.get_redis_connection(node)
    return client


def scripts_run(client: redis.Redis | RedisCluster, key: str = "") -> int:
    """Scripts run (FCALL or EVALSHA) on the server of ``key`` since its stats were
    reset: a try that Redis answered NOSCRIPT or Function not found (not loaded yet) is
    no run."""
    info = keys_server(client, key).info("commandstats")
    return sum(
        stats.get("calls", 0) - stats.get("failed_calls", 0) - stats.get("rejected_calls", 0)
        for stats in (info.get(f"cmdstat_{command}", {}) for command in ("fcall", "evalsha"))
    )
