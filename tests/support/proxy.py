"""A TCP proxy on loopback in front of a Redis master, that can hold back the
replication stream: a replica that falls behind, as a slow or partitioned network makes
it, for the replication and failover tests. On loopback a replica otherwise keeps up
so closely that no write is ever lost with its master."""

import contextlib
import socket
import threading


class _Link:
    def __init__(self, client: socket.socket, target: socket.socket) -> None:
        self.client = client
        self.target = target
        self.replication = False  # the client is a replica: it sent REPLCONF or PSYNC
        self.cut = False


class LinkProxy:
    """Forward connections from a free loopback port to ``target_port``.

    ``hold()`` stops passing on what the target sends to replicas (their connections
    stay up, other clients are served as usual); ``cut()`` closes every connection,
    dropping what was held, as a partition that outlives the target does.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.flowing = threading.Event()
        self.flowing.set()
        self.links: list[_Link] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        self.flowing.clear()

    def release(self) -> None:
        self.flowing.set()

    def cut(self) -> None:
        """Close every connection now, dropping whatever was held back."""
        for link in list(self.links):
            link.cut = True
            for sock in (link.client, link.target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        self.links.clear()

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        self.cut()
        self.flowing.set()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                target = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            link = _Link(client, target)
            self.links.append(link)
            threading.Thread(target=self._requests, args=(link,), daemon=True).start()
            threading.Thread(target=self._replies, args=(link,), daemon=True).start()

    def _requests(self, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while chunk := link.client.recv(65536):
                if b"REPLCONF" in chunk.upper() or b"PSYNC" in chunk.upper():
                    link.replication = True
                link.target.sendall(chunk)
        self._close(link)

    def _replies(self, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while chunk := link.target.recv(65536):
                if link.replication:
                    self.flowing.wait()
                    if link.cut:
                        return  # cut while held: what was held is dropped
                link.client.sendall(chunk)
        self._close(link)

    def _close(self, link: _Link) -> None:
        for sock in (link.client, link.target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
