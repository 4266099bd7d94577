"""A TCP relay between a client and a server on loopback, for tests that need the network to
misbehave at a chosen moment; subclasses decide how bytes move (`pump`)."""

from __future__ import annotations

import socket
import threading


class Relay:
    """Listens on a free loopback port (`address`) and connects each client to `target`, moving
    bytes with one `pump` thread per direction."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.connections = 0
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        for sock in [self._listener, *self._sockets]:
            sock.close()

    def pump(self, source: socket.socket, sink: socket.socket, *, from_server: bool) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            host, port = self._target.rsplit(":", 1)
            server = socket.create_connection((host, int(port)))
            self._sockets += [client, server]
            for source, sink, from_server in ((client, server, False), (server, client, True)):
                worker = threading.Thread(
                    target=self.pump, args=(source, sink), kwargs={"from_server": from_server}, daemon=True
                )
                worker.start()


def pass_bytes(source: socket.socket, sink: socket.socket, budget: int | None) -> bool:
    """Moves bytes from `source` to `sink`, at most `budget` of them (None: until the end);
    whether the budget was spent (False: the connection ended or failed first)."""
    try:
        while budget is None or budget > 0:
            data = source.recv(65536 if budget is None else min(65536, budget))
            if not data:
                return False
            sink.sendall(data)
            if budget is not None:
                budget -= len(data)
    except OSError:
        return False
    return True
