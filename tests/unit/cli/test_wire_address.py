"""The wire client reads a server URL as urllib's urlsplit reads it (scheme, lower-case
host, IPv6 without brackets, port, user and password), without importing urllib."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from muster.wire import address

URLS = {
    "a URL": "nats://127.0.0.1:4222",
    "host and port alone": "127.0.0.1:4222",
    "a bare name": "localhost",
    "TLS, upper-case host": "tls://Host.Example:4443",
    "user and password": "nats://u:p@h:1",
    "a user alone": "nats://u@h",
    "a password alone": "nats://:p@h:2",
    "IPv6 and a port": "[::1]:4222",
    "IPv6 alone": "nats://[::1]",
    "IPv6 with a zone": "nats://[fe80::1%eth0]:5",
    "a trailing slash": "nats://h:4222/",
    "a query": "nats://h:4222?x=1",
    "an @ in the user": "nats://a@b@h:3",
    "an empty port": "nats://h:",
    "an upper-case scheme": "NATS://H:7",
    "a colon in the password": "nats://u:p:q@h:9",
}


@pytest.mark.parametrize("url", URLS.values(), ids=URLS.keys())
def test_a_server_url_reads_as_urlsplit_reads_it(url: str) -> None:
    want = urlsplit(url if "://" in url else f"nats://{url}")
    assert tuple(address(url)) == (
        want.scheme,
        want.hostname,
        want.port,
        want.username,
        want.password,
    )


@pytest.mark.parametrize(
    ("url", "why"), [("h:99999", "out of range"), ("h:abc", "could not be cast")]
)
def test_a_bad_port_is_a_value_error_as_urlsplit_says(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        address(url)
    with pytest.raises(ValueError, match=why):
        _ = urlsplit(f"nats://{url}").port
