"""The redis-py client of a backend: one server, a master watched by Redis Sentinel, or
a Redis Cluster, as ``OPTIONS`` say (``CONNECTION``, ``URL``, ``SENTINELS``,
``CLUSTER``, ``CLUSTER_NODES``), or a Redis cache's. Only clients are made here; every
command goes through ``gateway.py``. After a failover the clients follow the new master on
their own (redis-py's Sentinel and Cluster clients), and the loops that use them retry.
"""

from __future__ import annotations

from typing import Any, cast

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel, SentinelConnectionPool

from django_redisqueue.core.conf import Options

Client = redis.Redis | RedisCluster


def make_client(options: Options) -> Client:
    """Return the client that ``options`` describe."""
    if options.connection:
        return cache_client(options.connection)
    kwargs = dict(options.client_kwargs or {})
    if options.sentinels:
        sentinel = Sentinel(
            list(options.sentinels), sentinel_kwargs=dict(options.sentinel_kwargs or {}), **kwargs
        )
        return sentinel.master_for(options.service_name, **kwargs)
    if options.cluster_nodes:
        nodes = [ClusterNode(host, port) for host, port in options.cluster_nodes]
        # cast: redis-py 5's annotations call RedisCluster abstract; it is not.
        return cast(Any, RedisCluster)(startup_nodes=nodes, **kwargs)
    if options.cluster:
        return RedisCluster.from_url(options.redis_url, **kwargs)
    return redis.Redis.from_url(options.redis_url, **kwargs)


def cache_client(alias: str) -> redis.Redis:
    """A client on the connection pool of the Redis cache ``CACHES[alias]``: Django's
    own (to the first server of its LOCATION, where the cache writes) or django-redis's."""
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    cache = caches[alias]
    if isinstance(cache, RedisCache):
        # Django gives no public way to its client; _cache is the one its methods use.
        return cache._cache.get_client(None, write=True)
    from django_redis import get_redis_connection

    return get_redis_connection(alias)


def describe(client: Client) -> str:
    """Where ``client`` sends its commands, for log lines and banners; for Sentinel,
    the master the sentinels name now (one question to a sentinel)."""
    if isinstance(client, RedisCluster):
        nodes = client.get_primaries()
        return (
            "cluster "
            + ", ".join(node.name for node in nodes[:3])
            + (f" (+{len(nodes) - 3} more masters)" if len(nodes) > 3 else "")
        )
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        try:
            host, port = pool.get_master_address()
            where = f"master {host}:{port}"
        except redis.RedisError as exc:
            where = f"no master known ({exc})"
        return f"sentinel service {pool.service_name!r}, {where}"
    kwargs: dict[str, Any] = pool.connection_kwargs
    if "path" in kwargs:
        return f"redis unix:{kwargs['path']}"
    return f"redis {kwargs.get('host', '?')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
