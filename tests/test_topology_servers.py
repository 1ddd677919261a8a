"""The throw-away Sentinel and Cluster topologies of ``tests.support.topologies`` work:
they start, fail over when a master dies, take the old master back, and leave nothing
behind."""

import os

from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

from tests.support.servers import RedisServer
from tests.support.topologies import RedisClusterGroup, RedisSentinelGroup


def assert_gone(servers: list[RedisServer]) -> None:
    for server in servers:
        assert not server.running
        assert not os.path.exists(server.directory)


def test_sentinel_group_fails_over_and_takes_the_old_master_back():
    with RedisSentinelGroup(replicas=2) as group:
        sentinel = Sentinel(group.sentinel_addresses, socket_timeout=1)
        client = sentinel.master_for(group.service_name, socket_timeout=1, decode_responses=True)
        client.set("key", "before")
        assert group.master_address() == group.master.address
        group.sync_replicas()

        old = group.kill_master()
        new_address = group.wait_for_failover(old.address)

        assert new_address != old.address
        assert group.master.address == new_address
        assert group.master is not old
        assert client.get("key") == "before"  # the replica had it, and is master now
        client.set("key", "after")

        group.restart(old)
        assert group.client(old).execute_command("ROLE")[0] == "slave"
        assert old in group.replicas
        group.sync_replicas()
        assert group.client(old).get("key") == "after"
        servers = group.servers
    assert_gone(servers)


def test_cluster_group_promotes_a_replica_when_a_master_dies():
    keys = {f"key:{i}": str(i) for i in range(30)}
    with RedisClusterGroup() as cluster:
        assert len(cluster.masters) == 3
        client = RedisCluster.from_url(cluster.url, decode_responses=True)
        for key, value in keys.items():
            client.set(key, value)
        assert len({cluster.master_for_key(key).port for key in keys}) == 3  # every shard
        assert [client.get(key) for key in keys] == list(keys.values())
        cluster.sync_replicas()

        victim = cluster.master_for_key("key:0")
        cluster.kill(victim)
        promoted = cluster.wait_for_failover(victim)

        assert promoted is not victim
        assert cluster.master_for_key("key:0") is promoted
        assert client.get("key:0") == "0"
        client.set("key:0", "again")
        assert [client.get(key) for key in list(keys)[1:]] == list(keys.values())[1:]

        cluster.restart(victim)
        assert cluster.client(victim).execute_command("ROLE")[0] == "slave"
        assert victim not in cluster.masters

        cluster.flush()
        assert client.get("key:0") is None
        servers = cluster.nodes
    assert_gone(servers)
