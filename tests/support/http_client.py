"""A plain HTTP/1.1 client on one kept-alive connection (the standard library's), for tests that send a server
thousands of raw requests: bytes as given, every answer read whole, a connection the server closed (after a 413,
say) opened again."""

from __future__ import annotations

import http.client
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes


class RawClient:
    """Requests to the server whose API is at `url` (.../v1), each answered within `timeout` seconds or an error."""

    def __init__(self, url: str, timeout: float = 30.0):
        where = urlsplit(url)
        self.host, self.port, self.timeout = where.hostname, where.port, timeout
        self.connection: http.client.HTTPConnection | None = None
        self.sent = 0

    def send(self, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> Answer:
        headers = {"Content-Type": "application/json", **(headers or {})}
        try:
            answer = self._send(method, path, body, headers)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            self.close()  # the server closed the kept-alive connection between requests: once more, anew
            answer = self._send(method, path, body, headers)
        self.sent += 1
        return answer

    def _send(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Answer:
        if self.connection is None:
            self.connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self.connection.connect()
            # no Nagle: a request's headers and body go out at once, not 40 ms apart (the peer's delayed ACK)
            self.connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        answer = Answer(response.status, response.getheader("content-type", ""), response.read())
        if response.will_close:
            self.close()
        return answer

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None
