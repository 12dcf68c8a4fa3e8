"""A small request/response TCP service where every message is authenticated.

Used by `hvdkeras.spark.run` (the driver serves the pickled function, the
MPI port names and collects results). Wire format, per connection:

* the server first sends ``MAGIC`` and a fresh 32-byte random nonce;
* each message is ``length (4 bytes, big endian) | header HMAC (32) | body |
  body HMAC (32)``. Both HMACs (SHA-256) are keyed with the per-job secret and
  cover a direction byte (``C`` client->server, ``S`` server->client), the
  connection's nonce and the message's sequence number in that direction; the
  first covers the length, the second the body;
* the header HMAC is checked before a byte of the body is read, so a peer
  without the secret can make the service read 36 bytes and no more, whatever
  length it claims; an authenticated length is still capped (MAX_MESSAGE_BYTES);
* the body is a pickle, unpickled only after its HMAC checked out
  (`hmac.compare_digest`), so nothing unauthenticated is ever deserialised.

A message with a wrong HMAC (wrong secret, tampered, replayed from another
connection or out of order) makes the server count a rejection and drop the
connection without answering. Responses are authenticated the same way, so
a client never unpickles data from an impostor either. The service serves at
most `max_connections` connections at once (more are closed at once), and a
connection must send its first request within FIRST_REQUEST_S.
"""

from __future__ import annotations

import hashlib
import hmac
import pickle
import secrets
import socket
import socketserver
import struct
import threading
from typing import Any, Callable, Optional

MAGIC = b"HVDKSVC1"
NONCE_BYTES = 32
MAC_BYTES = 32
# An authenticated message's largest body: results (say a model's weights)
# travel through the service, so this is generous; it never applies to a
# peer without the secret, which is cut off after the 36-byte header.
MAX_MESSAGE_BYTES = 1 << 30
IO_TIMEOUT_S = 120.0
FIRST_REQUEST_S = 10.0
MAX_CONNECTIONS = 64
_HEADER = struct.Struct(">I")


class ServiceError(RuntimeError):
    """A request failed: refused, connection lost, or the handler raised."""


class AuthenticationError(ServiceError):
    """The peer's message did not carry a valid HMAC (or the peer dropped us for ours)."""


def new_secret() -> bytes:
    """A per-job random key (32 bytes from the `secrets` module)."""
    return secrets.token_bytes(32)


def _mac(secret: bytes, part: bytes, direction: bytes, nonce: bytes, seq: int,
         content: bytes) -> bytes:
    """HMAC of one part (b"H" header, b"B" body) of message `seq` in `direction`."""
    return hmac.new(secret, part + direction + nonce + seq.to_bytes(8, "big") + content,
                    hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed by peer")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def send_frame(sock: socket.socket, secret: bytes, direction: bytes, nonce: bytes, seq: int,
               body: bytes) -> None:
    """Sends one authenticated frame."""
    header = _HEADER.pack(len(body))
    sock.sendall(header + _mac(secret, b"H", direction, nonce, seq, header) + body
                 + _mac(secret, b"B", direction, nonce, seq, body))


def recv_frame(sock: socket.socket, secret: bytes, direction: bytes, nonce: bytes,
               seq: int, wait: Optional[float] = -1.0) -> bytes:
    """Receives one frame; raises AuthenticationError when its HMAC is wrong.

    `wait` bounds the wait for the frame's header (None: no bound; the
    default keeps the socket's timeout); once the header is authenticated,
    the rest must arrive within IO_TIMEOUT_S.
    """
    if wait is None or wait >= 0:
        sock.settimeout(wait)
    head = _recv_exact(sock, _HEADER.size + MAC_BYTES)
    sock.settimeout(IO_TIMEOUT_S)
    header, header_mac = head[:_HEADER.size], head[_HEADER.size:]
    if not hmac.compare_digest(header_mac, _mac(secret, b"H", direction, nonce, seq, header)):
        raise AuthenticationError("message with a wrong HMAC (header)")
    (length,) = _HEADER.unpack(header)
    if length > MAX_MESSAGE_BYTES:
        raise AuthenticationError(f"message of {length} bytes refused (at most {MAX_MESSAGE_BYTES})")
    body = _recv_exact(sock, length)
    body_mac = _recv_exact(sock, MAC_BYTES)
    if not hmac.compare_digest(body_mac, _mac(secret, b"B", direction, nonce, seq, body)):
        raise AuthenticationError("message with a wrong HMAC (body)")
    return body


Handler = Callable[[str, dict], Any]


class Service:
    """Serves ``handler(kind, fields) -> response`` to authenticated clients.

    Args:
        secret: The per-job key (see `new_secret`).
        handler: Called for each authenticated request, from a thread per
            connection; its return value (picklable) is the response; an
            exception it raises becomes a `ServiceError` in the client.
        host: Interface to listen on: the address the clients reach (""
            listens on all interfaces).
        port: 0 picks a free port.
        max_connections: Connections served at once; more are closed at once
            (counted in `refused`).
    """

    def __init__(self, secret: bytes, handler: Handler, host: str = "", port: int = 0,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise ValueError("secret must be at least 16 random bytes (use new_secret()).")
        self.secret = secret
        self.handler = handler
        self.max_connections = max_connections
        self.rejected = 0
        self.refused = 0
        self.served = 0
        self._active = 0
        self._lock = threading.Lock()
        service = self

        class _RequestHandler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                service._serve_connection(self.request)

        class _Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = _Server((host, port), _RequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="hvdkeras-service", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the service listens on."""
        return self._server.server_address[:2]

    def _serve_connection(self, sock: socket.socket) -> None:
        with self._lock:
            admitted = self._active < self.max_connections
            if admitted:
                self._active += 1
            else:
                self.refused += 1
        if not admitted:
            sock.close()
            return
        try:
            self._serve_admitted(sock)
        finally:
            with self._lock:
                self._active -= 1

    def _serve_admitted(self, sock: socket.socket) -> None:
        sock.settimeout(IO_TIMEOUT_S)
        nonce = secrets.token_bytes(NONCE_BYTES)
        seq = 0
        try:
            sock.sendall(MAGIC + nonce)
            while True:
                try:
                    # The first request must come soon (an idle stranger does not
                    # hold a thread for long); an authenticated client may then
                    # stay idle for as long as its rank runs.
                    body = recv_frame(sock, self.secret, b"C", nonce, seq,
                                      wait=FIRST_REQUEST_S if seq == 0 else None)
                except AuthenticationError:
                    with self._lock:
                        self.rejected += 1
                    return  # drop the connection without a word
                except (ConnectionError, OSError, struct.error):
                    return
                request = pickle.loads(body)  # authenticated: safe to unpickle
                try:
                    kind = request.pop("kind")
                    response = {"ok": True, "value": self.handler(kind, request)}
                except Exception as exc:  # the handler's error goes back to the client
                    response = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                with self._lock:
                    self.served += 1
                send_frame(sock, self.secret, b"S", nonce, seq, pickle.dumps(response))
                seq += 1
        except OSError:
            return
        finally:
            try:
                sock.close()
            except OSError:
                pass

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)

    def __enter__(self) -> "Service":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Client:
    """One connection to a `Service`; `request` is safe to call from one thread at a time."""

    def __init__(self, address: tuple[str, int], secret: bytes,
                 timeout: Optional[float] = IO_TIMEOUT_S) -> None:
        self.secret = secret
        self._lock = threading.Lock()
        self._sock = socket.create_connection(address, timeout=timeout)
        greeting = _recv_exact(self._sock, len(MAGIC) + NONCE_BYTES)
        if greeting[:len(MAGIC)] != MAGIC:
            self._sock.close()
            raise ServiceError(f"{address} is not an hvdkeras service")
        self._nonce = greeting[len(MAGIC):]
        self._seq = 0

    def request(self, kind: str, **fields: Any) -> Any:
        """Sends one request and returns the handler's response."""
        body = pickle.dumps({"kind": kind, **fields})
        with self._lock:
            try:
                send_frame(self._sock, self.secret, b"C", self._nonce, self._seq, body)
                reply = recv_frame(self._sock, self.secret, b"S", self._nonce, self._seq)
            except (ConnectionError, OSError) as exc:
                raise ServiceError(
                    f"the service closed the connection ({exc}); it drops requests whose HMAC "
                    "is wrong (another job's secret?)") from None
            self._seq += 1
        response = pickle.loads(reply)
        if not response["ok"]:
            raise ServiceError(response["error"])
        return response["value"]

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
