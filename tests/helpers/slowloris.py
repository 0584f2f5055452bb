"""Slowloris clients for the HTTP-limit tests: loopback connections that send a request line and then trickle
header lines, never finishing the head. Bounded: they stop by themselves after `give_up_s`."""

from __future__ import annotations

import selectors
import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass
class SlowlorisResult:
    opened: int = 0
    closed_by_server: int = 0  # the server closed the connection (EOF or reset) before the client gave up
    refused: int = 0  # could not connect at all
    answers: list[bytes] = field(default_factory=list)  # what the server sent before closing, if anything


class Slowloris(threading.Thread):
    """`count` connections to 127.0.0.1:`port`, each sending one more header line every `trickle_s`."""

    def __init__(self, port: int, count: int, trickle_s: float = 0.5, give_up_s: float = 30.0) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.count = count
        self.trickle_s = trickle_s
        self.give_up_s = give_up_s
        self.result = SlowlorisResult()
        self.all_open = threading.Event()

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        sockets: dict[socket.socket, bytes] = {}
        for _ in range(self.count):
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                self.result.refused += 1
                continue
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
            sockets[sock] = b""
        self.result.opened = len(sockets)
        self.all_open.set()
        deadline = time.monotonic() + self.give_up_s
        next_trickle = time.monotonic() + self.trickle_s
        line = 0
        while sockets and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    sockets[sock] += data
                    continue
                self._closed(selector, sockets, sock)
            if time.monotonic() >= next_trickle:
                line += 1
                for sock in list(sockets):
                    try:
                        sock.send(b"X-Trickle-%d: still typing\r\n" % line)
                    except OSError:
                        self._closed(selector, sockets, sock)
                next_trickle = time.monotonic() + self.trickle_s
        for sock in sockets:
            sock.close()
        selector.close()

    def _closed(
        self, selector: selectors.BaseSelector, sockets: dict[socket.socket, bytes], sock: socket.socket
    ) -> None:
        self.result.closed_by_server += 1
        self.result.answers.append(sockets.pop(sock))
        selector.unregister(sock)
        sock.close()
