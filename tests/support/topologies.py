"""Throw-away Redis topologies for tests and benchmarks, on loopback ports only.

``RedisSentinelGroup`` runs a master, its replicas and the Sentinels watching them;
``RedisClusterGroup`` runs a Redis Cluster. Both can kill a master and wait for the
failover, and keep nothing on disk once stopped.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import redis
from redis.cluster import ClusterNode
from redis.crc import key_slot

from tests.support.servers import (
    HOST,
    RedisServer,
    StartStop,
    client_at,
    free_ports,
    server_info,
    server_program,
    system_program,
    wait_for,
)


def _logged_server(*args: str, port: int) -> RedisServer:
    """A RedisServer of a group: it logs to a file in its directory (quoted in timeout
    errors) and starts replicating at once rather than after the 5 s default delay of
    diskless sync."""
    server = RedisServer(port=port)
    server.extra_args = (
        "--logfile",
        os.path.join(server.directory, "redis.log"),
        "--repl-diskless-sync-delay",
        "0",
        *args,
    )
    return server


def _log_tail(server: RedisServer, lines: int = 8) -> str:
    for name in ("redis.log", "sentinel.log"):
        try:
            with open(os.path.join(server.directory, name), errors="replace") as log:
                tail = log.readlines()[-lines:]
        except OSError:
            continue
        return f"--- {server!r}, last lines of {name}:\n" + "".join(tail)
    return ""


def _as_dict(reply: Any) -> dict[str, Any]:
    """A Redis map as a dict, whether it came as a RESP3 map or a RESP2 flat list."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


class _Topology(StartStop):
    """What the groups share: the servers, polling clients, context management."""

    data_servers: list[RedisServer]  # the redis-servers holding data (not the Sentinels)

    def __init__(self) -> None:
        self._clients: dict[int, redis.Redis] = {}

    @property
    def servers(self) -> list[RedisServer]:
        raise NotImplementedError

    def client(self, server: RedisServer) -> redis.Redis:
        """A plain client of one server (no retries, ``str`` replies), kept for reuse."""
        if server.port not in self._clients:
            self._clients[server.port] = client_at(server.port)
        return self._clients[server.port]

    def _server_at(self, port: int) -> RedisServer | None:
        return next((s for s in self.servers if s.port == port), None)

    def _logs(self) -> str:
        return "".join(_log_tail(server) for server in self.servers)

    def sync_replicas(self, timeout: float = 10.0) -> None:
        """Return once every running replica has processed what its master had written when
        called, so that a test can kill the master without losing acknowledged writes."""
        offsets: dict[int, int] = {}  # master's port -> its replication offset now
        replicas: list[tuple[RedisServer, int]] = []  # replica, its master's port
        for server in self.data_servers:
            if server.running:
                info = server_info(self.client(server), "replication")
                if info["role"] == "master":
                    offsets[server.port] = info["master_repl_offset"]
                else:
                    replicas.append((server, info["master_port"]))

        def synced() -> bool:
            # Ask the replicas themselves: the offsets a master lists for its replicas
            # come from their acknowledgements, sent once a second.
            return all(
                server_info(self.client(replica), "replication")["slave_repl_offset"]
                >= offsets[port]
                for replica, port in replicas
                if port in offsets
            )

        wait_for("the replicas to catch up with their masters", synced, timeout, self._logs)

    def stop(self) -> None:
        """Stop every process and remove every directory the group made."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        for server in self.servers:
            server.stop()


class SentinelServer(RedisServer):
    """One Sentinel: ``redis-server sentinel.conf --sentinel`` with a generated
    configuration, in its own directory. Sentinel rewrites that file as it learns, so a
    killed Sentinel started again remembers what it knew."""

    # Sentinel's internal periods (SENTINEL DEBUG, Redis 7.0+), shortened from production
    # defaults that suit a WAN. A master counts as down once a ping has gone unanswered for
    # down-after-milliseconds; Sentinel pings (and reconnects) once per ping period, so
    # 400 ms (1 s) detects a crash 1.0-1.4 s after it rather than 1-2 s. Not lower: a
    # replica is promotable only if its last INFO, sent every 1 s during a failover (not
    # tunable), is under 5 ping periods old. They ask each other whether the master is
    # down every 100 ms (1 s), say hello every 200 ms (2 s: how they find each other and
    # spread a new master) and send INFO every 1 s (10 s: finds new replicas sooner).
    TUNING = (
        *("ping-period", "400", "ask-period", "100"),
        *("publish-period", "200", "info-period", "1000"),
    )

    def __init__(self, config: str, *, port: int) -> None:
        super().__init__(port=port)
        self.config_file = os.path.join(self.directory, "sentinel.conf")
        log = os.path.join(self.directory, "sentinel.log")
        with open(self.config_file, "w") as file:
            # Quoted: the temporary directory's path may hold spaces.
            file.write(
                f'port {port}\nbind {HOST}\ndir "{self.directory}"\nlogfile "{log}"\n{config}'
            )

    def _command(self) -> list[str]:
        return [server_program(), self.config_file, "--sentinel"]

    def start(self, timeout: float = 10.0, *, loaded: bool = True) -> None:
        """Start the Sentinel and return once it answers PING, its timers tuned."""
        super().start(timeout, loaded=loaded)
        client = client_at(self.port)
        try:
            client.execute_command("SENTINEL", "DEBUG", *self.TUNING)
        except redis.ResponseError:
            pass  # Redis before 7.0: the slower defaults still work
        finally:
            client.close()


class RedisSentinelGroup(_Topology):
    """A master, ``replicas`` replicas and ``sentinels`` Sentinels watching them, on 127.0.0.1.

        with RedisSentinelGroup() as group:
            sentinel = redis.sentinel.Sentinel(group.sentinel_addresses)
            client = sentinel.master_for(group.service_name)
            old = group.kill_master()
            group.wait_for_failover(old.address)
            group.restart(old)   # it comes back as a replica of the new master

    ``extra_args`` go to every redis-server (not to the Sentinels), e.g. "--appendonly", "yes".
    """

    def __init__(
        self,
        *extra_args: str,
        replicas: int = 1,
        sentinels: int = 3,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 2000,
        service_name: str = "mymaster",
    ) -> None:
        super().__init__()
        if sentinels < 1 or replicas < 0:
            raise ValueError("a Sentinel group needs a Sentinel and no negative replicas")
        self.service_name = service_name
        self.quorum = sentinels // 2 + 1
        ports = free_ports(1 + replicas + sentinels)
        master = _logged_server(*extra_args, port=ports[0])
        self.data_servers: list[RedisServer] = [master] + [
            _logged_server("--replicaof", HOST, str(master.port), *extra_args, port=port)
            for port in ports[1 : 1 + replicas]
        ]
        # The failover timeout also bounds a failed election (retried after twice that)
        # and the wait for the promoted replica's INFO (every 1 s), hence 2 s, not less.
        config = (
            "sentinel resolve-hostnames no\n"
            "sentinel announce-hostnames no\n"
            f"sentinel monitor {service_name} {HOST} {master.port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {service_name} {down_after_ms}\n"
            f"sentinel failover-timeout {service_name} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {service_name} 1\n"
        )
        self.sentinels = [SentinelServer(config, port=port) for port in ports[1 + replicas :]]

    @property
    def servers(self) -> list[RedisServer]:
        return [*self.data_servers, *self.sentinels]

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [sentinel.address for sentinel in self.sentinels]

    def start(self, timeout: float = 30.0) -> None:
        """Start the servers, then the Sentinels; return once every Sentinel knows the
        master, every replica and every other Sentinel, and can reach its quorum."""
        try:
            for server in self.data_servers:
                server.start()
            wait_for(
                "the replicas to sync with the master",
                lambda: all(self._replica_of(s, self.data_servers[0]) for s in self.replicas),
                timeout,
                self._logs,
            )
            for sentinel in self.sentinels:
                sentinel.start()
            self._wait_settled(self.data_servers[0], timeout)
        except BaseException:
            self.stop()
            raise

    def master_address(self) -> tuple[str, int]:
        """The master's address, as the first Sentinel that answers names it."""
        for sentinel in self.sentinels:
            if sentinel.running:
                try:
                    host, port = self.client(sentinel).execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name
                    )
                    return (str(host), int(port))
                except redis.RedisError:
                    continue
        raise RuntimeError(f"no Sentinel answers for {self.service_name!r}")

    @property
    def master(self) -> RedisServer:
        """The server the Sentinels name as master now (the dead one until they fail over)."""
        host, port = self.master_address()
        server = self._server_at(port)
        if server is None:
            raise RuntimeError(f"the Sentinels name {host}:{port}, which is none of this group")
        return server

    @property
    def replicas(self) -> list[RedisServer]:
        """The data servers other than the master (some may be down)."""
        master = self.master if any(s.running for s in self.sentinels) else self.data_servers[0]
        return [server for server in self.data_servers if server is not master]

    def kill_master(self) -> RedisServer:
        """SIGKILL the current master and return it; ``restart()`` can bring it back."""
        server = self.master
        server.kill()
        return server

    def wait_for_failover(
        self, old_address: tuple[str, int], timeout: float = 30.0
    ) -> tuple[str, int]:
        """Wait until every running Sentinel names the same master other than
        ``old_address``, and that server answers ROLE as a master; return its address."""

        def failed_over() -> tuple[str, int] | None:
            answers = {
                tuple(
                    self.client(sentinel).execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name
                    )
                )
                for sentinel in self.sentinels
                if sentinel.running
            }
            if len(answers) != 1:
                return None
            host, port = answers.pop()
            address = (str(host), int(port))
            server = self._server_at(address[1])
            if address == tuple(old_address) or server is None or not server.running:
                return None
            return address if self.client(server).execute_command("ROLE")[0] == "master" else None

        return wait_for(
            f"the Sentinels to replace the master at {old_address}",
            failed_over,
            timeout,
            self._logs,
        )

    def restart(self, server: RedisServer, timeout: float = 30.0) -> None:
        """Start a killed server or Sentinel again, with its original arguments, and return
        once every replica replicates the current master in sync and every Sentinel lists
        every running server and Sentinel as healthy. (A restarted old master comes back as
        an empty master; the Sentinels make it a replica about a second later.)"""
        server.start()
        master = self.master
        self._wait_settled(master, timeout)

    def _replica_of(self, server: RedisServer, master: RedisServer) -> bool:
        info = server_info(self.client(server), "replication")
        return bool(
            info["role"] == "slave"
            and info["master_port"] == master.port
            and info["master_link_status"] == "up"
        )

    def _wait_settled(self, master: RedisServer, timeout: float) -> None:
        """Wait until the running replicas replicate ``master`` and every running Sentinel
        sees the master, those replicas and the other running Sentinels as healthy."""
        replicas = [s for s in self.data_servers if s is not master and s.running]
        sentinels = [s for s in self.sentinels if s.running]
        bad = {"s_down", "o_down", "disconnected"}

        def healthy(state: dict[str, Any]) -> bool:
            return not bad & set(str(state["flags"]).split(","))

        def settled() -> bool:
            if not all(self._replica_of(replica, master) for replica in replicas):
                return False
            for sentinel in sentinels:
                client = self.client(sentinel)
                name = self.service_name
                state = _as_dict(client.execute_command("SENTINEL", "MASTER", name))
                if int(state["port"]) != master.port or not healthy(state):
                    return False
                known = [_as_dict(r) for r in client.execute_command("SENTINEL", "REPLICAS", name)]
                ports = {int(r["port"]) for r in known if healthy(r)}
                if not {r.port for r in replicas} <= ports:
                    return False
                others = [
                    _as_dict(s) for s in client.execute_command("SENTINEL", "SENTINELS", name)
                ]
                ports = {int(s["port"]) for s in others if healthy(s)}
                if not {s.port for s in sentinels if s is not sentinel} <= ports:
                    return False
                client.execute_command("SENTINEL", "CKQUORUM", name)  # raises if it cannot
            return True

        wait_for(
            f"the Sentinels to agree on master {master.address} and {len(replicas)} replicas",
            settled,
            timeout,
            self._logs,
        )


class _NodeEntry:
    """One line of CLUSTER NODES."""

    def __init__(self, line: str) -> None:
        fields = line.split()
        self.id = fields[0]
        self.port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
        self.flags = set(fields[2].split(","))
        self.master_id = fields[3] if fields[3] != "-" else ""
        self.slots: list[tuple[int, int]] = []
        for item in fields[8:]:
            if item.startswith("["):
                continue  # a slot being imported or migrated
            first, _, last = item.partition("-")
            self.slots.append((int(first), int(last or first)))

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        return bool({"fail", "fail?", "handshake", "noaddr"} & self.flags)

    def serves(self, slot: int) -> bool:
        return any(first <= slot <= last for first, last in self.slots)

    def signature(self) -> tuple[str, bool, str, tuple[tuple[int, int], ...]]:
        return (self.id, self.is_master, self.master_id, tuple(sorted(self.slots)))


class RedisClusterGroup(_Topology):
    """A Redis Cluster of ``masters`` masters with ``replicas_per_master`` replicas each,
    on 127.0.0.1, built by ``redis-cli --cluster create``.

        with RedisClusterGroup() as cluster:
            client = redis.cluster.RedisCluster.from_url(cluster.url)
            victim = cluster.master_for_key("key")
            cluster.kill(victim)
            cluster.wait_for_failover(victim)  # a replica of victim's shard now serves it
            cluster.restart(victim)            # it comes back as a replica

    ``require_full_coverage`` is Redis's default: while a shard has no master the whole
    cluster refuses commands; with False, only that shard's slots do.
    ``extra_args`` go to every node.
    """

    def __init__(
        self,
        *extra_args: str,
        masters: int = 3,
        replicas_per_master: int = 1,
        node_timeout_ms: int = 1000,
        require_full_coverage: bool = True,
    ) -> None:
        super().__init__()
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.replicas_per_master = replicas_per_master
        count = masters * (1 + replicas_per_master)
        ports = free_ports(2 * count)
        self.nodes = [
            _logged_server(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",  # in the node's own directory
                "--cluster-node-timeout",
                str(node_timeout_ms),
                # The bus port defaults to port + 10000, which may be taken or above 65535.
                "--cluster-port",
                str(bus_port),
                # A replica whose link has been down "too long" (relative to the node
                # timeout) refuses to be promoted; 0 lets it stand whenever its master fails.
                "--cluster-replica-validity-factor",
                "0",
                "--cluster-require-full-coverage",
                "yes" if require_full_coverage else "no",
                *extra_args,
                port=port,
            )
            for port, bus_port in zip(ports[::2], ports[1::2], strict=True)
        ]
        self.data_servers = self.nodes
        self.node_ids: dict[int, str] = {}  # port -> cluster node id
        self._shard_slot: dict[int, int] = {}  # port of a killed node -> a slot of its shard

    @property
    def servers(self) -> list[RedisServer]:
        return self.nodes

    @property
    def url(self) -> str:
        """``redis://`` URL of the first running node, for RedisCluster.from_url()."""
        node = next((n for n in self.nodes if n.running), self.nodes[0])
        return f"redis://{HOST}:{node.port}"

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        """Every node, for RedisCluster(startup_nodes=...)."""
        return [ClusterNode(HOST, node.port) for node in self.nodes]

    def start(self, timeout: float = 30.0) -> None:
        """Start the nodes, create the cluster, and return once every node agrees on a
        configuration that serves every slot and every replica is in sync."""
        try:
            for node in self.nodes:
                node.start()
            self.node_ids = {
                n.port: self.client(n).execute_command("CLUSTER", "MYID") for n in self.nodes
            }
            command = [
                system_program("redis-cli"),
                "--cluster",
                "create",
                *(f"{HOST}:{node.port}" for node in self.nodes),
                "--cluster-replicas",
                str(self.replicas_per_master),
                "--cluster-yes",
            ]
            try:
                result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired as exc:
                raise RuntimeError(f"redis-cli --cluster create took over {timeout:g} s") from exc
            if result.returncode != 0:
                raise RuntimeError(
                    f"redis-cli --cluster create failed:\n{result.stdout}{result.stderr}"
                )
            self._wait_settled(timeout)
        except BaseException:
            self.stop()
            raise

    def _view(self, node: RedisServer) -> list[_NodeEntry]:
        """The cluster's configuration as ``node`` sees it."""
        text = self.client(node).execute_command("CLUSTER", "NODES")
        return [_NodeEntry(line) for line in str(text).splitlines() if line.strip()]

    def _state_ok(self, node: RedisServer) -> bool:
        return "cluster_state:ok" in str(self.client(node).execute_command("CLUSTER", "INFO"))

    def _entry_serving(self, view: list[_NodeEntry], slot: int) -> _NodeEntry | None:
        return next((e for e in view if e.is_master and e.serves(slot)), None)

    def master_for_key(self, key: str | bytes) -> RedisServer:
        """The node that serves ``key``'s slot, in the first running node's view."""
        slot = key_slot(key.encode() if isinstance(key, str) else key)
        viewer = next(n for n in self.nodes if n.running)
        entry = self._entry_serving(self._view(viewer), slot)
        server = self._server_at(entry.port) if entry else None
        if server is None:
            raise RuntimeError(f"no node of this group serves slot {slot}")
        return server

    @property
    def masters(self) -> list[RedisServer]:
        """The running nodes that are masters now."""
        return [
            n
            for n in self.nodes
            if n.running and self.client(n).execute_command("ROLE")[0] == "master"
        ]

    def kill(self, server: RedisServer) -> None:
        """SIGKILL a node, remembering its shard for ``wait_for_failover()``."""
        viewer = next((n for n in self.nodes if n.running and n is not server), None)
        if viewer is None:
            raise RuntimeError("no other node of the cluster is running")
        view = {e.id: e for e in self._view(viewer)}
        entry = view[self.node_ids[server.port]]
        shard_master = entry if entry.is_master else view[entry.master_id]
        if shard_master.slots:
            self._shard_slot[server.port] = shard_master.slots[0][0]
        server.kill()

    def wait_for_failover(self, killed: RedisServer, timeout: float = 30.0) -> RedisServer:
        """Wait until every running node flags ``killed`` as failed, names the same live
        master for its shard's slots and says ``cluster_state:ok``; return that master
        (a promoted replica if ``killed`` was the master, else the unchanged master)."""
        if killed.port not in self._shard_slot:
            raise ValueError(f"{killed!r} was not stopped by kill() or served no slots")
        slot, killed_id = self._shard_slot[killed.port], self.node_ids[killed.port]

        def failed_over() -> RedisServer | None:
            owners = set()
            for node in self.nodes:
                if not node.running:
                    continue
                view = self._view(node)
                if not self._state_ok(node) or not any(
                    e.id == killed_id and "fail" in e.flags for e in view
                ):
                    return None
                entry = self._entry_serving(view, slot)
                if entry is None or entry.failing:
                    return None
                owners.add(entry.port)
            server = self._server_at(owners.pop()) if len(owners) == 1 else None
            if server is None or not server.running:
                return None
            return server if self.client(server).execute_command("ROLE")[0] == "master" else None

        return wait_for(
            f"a replica to replace {killed!r} (slot {slot})", failed_over, timeout, self._logs
        )

    def restart(self, server: RedisServer, timeout: float = 30.0) -> None:
        """Start a killed node again (same port, directory and nodes.conf) and return once
        it has rejoined, a replica in sync if its shard failed over meanwhile, and every
        node agrees on the configuration."""
        server.start()
        self._shard_slot.pop(server.port, None)
        self._wait_settled(timeout)

    def flush(self) -> None:
        """FLUSHALL on every running master."""
        for node in self.masters:
            self.client(node).flushall()

    def _wait_settled(self, timeout: float) -> None:
        """Wait until every running node says ``cluster_state:ok`` and has the same view:
        every running node healthy, every slot served, each running replica in sync."""
        running = [n for n in self.nodes if n.running]
        running_ids = {self.node_ids[n.port] for n in running}

        def settled() -> bool:
            signatures = set()
            for node in running:
                if not self._state_ok(node):
                    return False
                view = self._view(node)
                if any(e.failing for e in view if e.id in running_ids):
                    return False
                served = sum(
                    last - first + 1 for e in view if e.is_master for first, last in e.slots
                )
                if served != 16384:
                    return False
                signatures.add(frozenset(e.signature() for e in view))
                info = server_info(self.client(node), "replication")
                if info["role"] == "slave" and info["master_link_status"] != "up":
                    return False
            return len(signatures) == 1

        wait_for(
            "the cluster to settle (cluster_state:ok everywhere)", settled, timeout, self._logs
        )
