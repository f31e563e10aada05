"""Plumbing: one NATS request-reply over a plain blocking socket, for the CLI.

A `muster queue` or `squeue` call makes one request and exits, so the asyncio client
(nats-py, its JetStream API, asyncio itself) costs more to import than the call takes.
This speaks the few verbs of the NATS client protocol one request needs: INFO, CONNECT
(with the NKey answer to the server's nonce, and TLS when asked), SUB on a fresh inbox,
PUB with that reply subject, and MSG/HMSG back ("503" headers: no responders).
Services keep nats-py; nothing here is async.
"""

from __future__ import annotations

import _socket  # socket.py's own import builds enums of every constant: not needed here
import os

from shared.lean_json import dumps, loads  # json's regexes and msgspec cost a start more

TYPE_CHECKING = False  # mypy takes it as true; `typing` costs a one-shot command to import
if TYPE_CHECKING:
    import ssl
    from typing import Any

CRLF = b"\r\n"


class Address(tuple[str, "str | None", "int | None", "str | None", "str | None"]):
    """A server URL's parts, as `urllib.parse.urlsplit` reads them (a tuple with named
    fields, as a NamedTuple would be, without `typing`)."""

    __slots__ = ()

    def __new__(
        cls,
        scheme: str,
        host: str | None,
        port: int | None,
        username: str | None,
        password: str | None,
    ) -> Address:
        return super().__new__(cls, (scheme, host, port, username, password))

    @property
    def scheme(self) -> str:
        return self[0]

    @property
    def host(self) -> str | None:  # lower case, IPv6 without its brackets
        return self[1]

    @property
    def port(self) -> int | None:
        return self[2]

    @property
    def username(self) -> str | None:
        return self[3]

    @property
    def password(self) -> str | None:
        return self[4]


def address(server: str) -> Address:
    """`nats://user:pass@host:4222` (or `host:port`, `tls://...`, `[::1]:4222`) read
    as urlsplit reads it, without urllib's imports (ipaddress and more, on every call);
    ValueError for a port that is not one, as urlsplit's `port`."""
    text = server if "://" in server else f"nats://{server}"
    scheme, _, rest = text.partition("://")
    for end in "/?#":
        rest = rest.split(end, 1)[0]
    userinfo, has_user, hostinfo = rest.rpartition("@")
    username = password = None
    if has_user:
        username, has_password, password_text = userinfo.partition(":")
        password = password_text if has_password else None
    _, bracket, bracketed = hostinfo.partition("[")
    if bracket:
        host, _, after = bracketed.partition("]")
        port_text = after.partition(":")[2]
    else:
        host, _, port_text = hostinfo.partition(":")
    port = None
    if port_text:
        if not (port_text.isdigit() and port_text.isascii()):
            raise ValueError(f"Port could not be cast to integer value as {port_text!r}")
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ValueError("Port out of range 0-65535")
    name, percent, zone = host.partition("%")
    return Address(scheme.lower(), name.lower() + percent + zone or None, port, username, password)


class Unreachable(OSError):
    """No server of the cluster accepted a connection; `servers` lists what was tried."""

    def __init__(self, servers: list[str], why: str) -> None:
        super().__init__(f"cannot reach the cluster's NATS at {', '.join(servers)}: {why}")
        self.servers = servers
        self.why = why


class NoResponders(Exception):
    """Nothing subscribes to the subject (the service is not running, or not yet)."""


class ServerError(Exception):
    """The server's `-ERR` (an authorization violation, a bad credential)."""


class BadCredential(Exception):
    """The bus credential file cannot be read or holds no NKey seed."""


def request(
    servers: list[str],
    subject: str,
    payload: bytes,
    *,
    timeout: float,
    connect_timeout: float = 5.0,
    creds: str = "",
    tls_ca: str = "",
    inbox_prefix: str = "_INBOX",
) -> bytes:
    """The reply's payload to `payload` sent to `subject` on the first server that
    answers; TimeoutError when no reply comes within `timeout`."""
    conn = connect(servers, connect_timeout, creds, tls_ca)
    try:
        return conn.request(subject, payload, timeout, inbox_prefix)
    finally:
        conn.close()


def connect(servers: list[str], timeout: float, creds: str = "", tls_ca: str = "") -> Connection:
    last = "no server given"
    for server in servers:
        try:
            return Connection.open(server, timeout, creds, tls_ca)
        except (OSError, TimeoutError) as err:  # refused, reset, no route, TLS: the next one
            last = err.strerror or str(err) if isinstance(err, OSError) else str(err)
    raise Unreachable(servers, last)


class Connection:
    """One connected, authenticated client; `request` then `close`."""

    def __init__(self, sock: _socket.socket | ssl.SSLSocket) -> None:
        self.sock = sock
        self.buf = b""

    @classmethod
    def open(cls, server: str, timeout: float, creds: str, tls_ca: str) -> Connection:
        url = address(server)
        host, port = url.host or "127.0.0.1", url.port or 4222
        sock = _open_socket(host, port, timeout)
        conn = cls(sock)
        try:
            info = conn._info()
            if tls_ca or info.get("tls_required") or url.scheme == "tls":
                conn._start_tls(host, tls_ca)
            fields = dumps(_connect_fields(info, url, creds)).encode()
            conn._send(b"CONNECT " + fields + CRLF + b"PING")  # one write (see request)
            conn._expect_pong()
        except BaseException:
            sock.close()
            raise
        return conn

    def request(self, subject: str, payload: bytes, timeout: float, inbox_prefix: str) -> bytes:
        inbox = f"{inbox_prefix}.{os.urandom(12).hex()}"
        self.sock.settimeout(timeout)
        # one write: a second small one would wait (Nagle) for the server's delayed ACK
        # of the first, 40 ms on Linux
        sub = f"SUB {inbox} 1".encode() + CRLF
        self._send(sub + f"PUB {subject} {inbox} {len(payload)}".encode() + CRLF + payload)
        while True:
            line = self._line()
            if line.startswith((b"MSG ", b"HMSG ")):
                headers, body = self._message(line)
                if headers.startswith(b"NATS/1.0 503"):
                    raise NoResponders(subject)
                return body
            self._control(line)

    def close(self) -> None:
        self.sock.close()

    # --- protocol -------------------------------------------------------------------

    def _info(self) -> dict[str, Any]:
        line = self._line()
        if not line.startswith(b"INFO "):
            raise ServerError(f"not a NATS server: {line[:60]!r}")
        info: dict[str, Any] = loads(line[5:])
        return info

    def _start_tls(self, host: str, tls_ca: str) -> None:
        import socket
        import ssl  # only a TLS bus pays for them

        raw, timeout = self.sock, self.sock.gettimeout()
        plain = socket.socket(raw.family, raw.type, raw.proto, raw.detach())
        plain.settimeout(timeout)
        context = ssl.create_default_context(cafile=tls_ca or None)
        self.sock = context.wrap_socket(plain, server_hostname=host)

    def _expect_pong(self) -> None:
        while True:
            line = self._line()
            if line == b"PONG":
                return
            self._control(line)

    def _control(self, line: bytes) -> None:
        if line == b"PING":
            self._send(b"PONG")
        elif line.startswith(b"-ERR"):
            raise ServerError(line[4:].strip().strip(b"'").decode(errors="replace"))
        # +OK, INFO updates, PONG: nothing to do

    def _message(self, line: bytes) -> tuple[bytes, bytes]:
        """(headers, payload) of the MSG or HMSG whose control line is `line`."""
        parts = line.split()
        if parts[0] == b"HMSG":
            header_len, total = int(parts[-2]), int(parts[-1])
        else:
            header_len, total = 0, int(parts[-1])
        data = self._exactly(total + 2)[:total]
        return data[:header_len], data[header_len:]

    def _send(self, data: bytes) -> None:
        self.sock.sendall(data + CRLF)

    def _line(self) -> bytes:
        while (at := self.buf.find(CRLF)) < 0:
            self._fill()
        line, self.buf = self.buf[:at], self.buf[at + 2 :]
        return line

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def _fill(self) -> None:
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise
        except OSError as err:
            raise ConnectionError(f"the connection failed: {err}") from err
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buf += chunk


def _open_socket(host: str, port: int, timeout: float) -> _socket.socket:
    """socket.create_connection's loop over the host's addresses (the last error
    raised), on the C module alone."""
    # an ASCII name as bytes: getaddrinfo encodes a str with the idna codec (stringprep,
    # unicodedata: imports the call does not need)
    name = host.encode() if host.isascii() else host
    last: OSError = OSError(f"getaddrinfo found no address for {host}")
    for family, kind, proto, _, addr in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)  # as asyncio sets it
            sock.settimeout(timeout)
            sock.connect(addr)
            return sock
        except OSError as err:
            sock.close()
            last = err
    raise last


def _connect_fields(info: dict[str, Any], url: Address, creds: str) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "verbose": False,
        "pedantic": False,
        "lang": "python-muster-cli",
        "version": "1",
        "protocol": 1,
        "headers": True,
        "no_responders": True,
        "tls_required": bool(info.get("tls_required")),
    }
    if url.username:
        fields["user"], fields["pass"] = url.username, url.password or ""
    if creds:
        try:
            with open(creds) as f:
                seed = f.read().strip()
        except OSError as err:
            raise BadCredential(f"cannot read the bus credential {creds}: {err.strerror}") from err
        fields.update(_nkey_answer(seed, creds, str(info.get("nonce", ""))))
    return fields


def _nkey_answer(seed: str, path: str, nonce: str) -> dict[str, str]:
    """The CONNECT fields that prove the seed's key: its public key and the nonce signed."""
    import binascii

    from shared.identity_sodium import BadSeed, SeedPair  # nkeys' signatures, lighter

    try:
        pair = SeedPair(seed)
    except BadSeed as err:
        raise BadCredential(f"the bus credential {path} holds no NKey seed ({err})") from err
    sig = binascii.b2a_base64(pair.sign(nonce.encode()), newline=False).decode()
    return {"nkey": pair.public_key.decode(), "sig": sig}
