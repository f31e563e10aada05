"""muster.wire against a secured NATS server as `muster up` starts one: TLS verified
against the cluster's CA, the user's own NKey answering the server's nonce (signed by the
CLI's light ed25519 path), so a request gets as far as the server's routing (nobody
subscribed: NoResponders); a CA that did not sign the server is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from muster import wire
from shared import embedded
from shared.identity_files import provision_keys
from shared.security import make_tls, provision_bus


async def test_the_cli_speaks_tls_and_nkeys_to_a_secured_server(tmp_path: Path) -> None:
    provision_keys(str(tmp_path / "keys"), ("alice",))
    alice = tmp_path / "keys" / "alice.nk"
    public = (tmp_path / "keys" / "alice.pub").read_text().strip()
    bus = provision_bus(tmp_path, ["node01"], {public: "alice"})
    tls = make_tls(tmp_path)
    server = embedded.start_nats(tmp_path, config=bus.auth_conf.read_text() + tls.nats_block())
    try:

        def ask(ca: Path) -> bytes:
            return wire.request(
                [server.url],
                "muster.api.queue",
                b"{}",
                timeout=10,
                creds=str(alice),
                tls_ca=str(ca),
                inbox_prefix="_INBOX.alice",
            )

        with pytest.raises(wire.NoResponders):
            await asyncio.to_thread(ask, tls.ca)
        other = make_tls(tmp_path / "other")  # a CA that did not sign the server
        with pytest.raises(wire.Unreachable, match=r"(?i)certificate"):
            await asyncio.to_thread(ask, other.ca)
    finally:
        server.stop()
