"""The key the gateway signs with is found as the CLI finds it."""

from __future__ import annotations

import os

import pytest

from services.gateway.settings import GatewaySettings, key_path

HOME_KEY = os.path.join(os.path.expanduser("~"), ".muster", "user.nk")
CASES = {
    "a named key file wins": (
        GatewaySettings(key_file="/k/me.nk", key_dir="/d", user="al"),
        {"/d/al.nk"},
        "/k/me.nk",
    ),
    "the user's key in the key folder": (
        GatewaySettings(key_dir="/d", user="al", state_dir="/s"),
        {"/d/al.nk", "/s/keys/al.nk"},
        "/d/al.nk",
    ),
    "else the state folder's keys": (
        GatewaySettings(key_dir="/d", user="al", state_dir="/s"),
        {"/s/keys/al.nk"},
        "/s/keys/al.nk",
    ),
    "else the user's own key": (GatewaySettings(user="al", state_dir="/s"), set(), HOME_KEY),
}


@pytest.mark.parametrize(("settings", "present", "want"), CASES.values(), ids=CASES)
def test_key_path(settings: GatewaySettings, present: set[str], want: str) -> None:
    assert key_path(settings, exists=present.__contains__) == want


def test_the_gateway_reads_its_port_and_user_from_the_environment() -> None:
    got = GatewaySettings.from_env({"MUSTER_HTTP_PORT": "9001", "MUSTER_USER": "bob"})
    assert (got.http_host, got.http_port, got.user, got.service_name) == (
        "127.0.0.1",
        9001,
        "bob",
        "gateway",
    )
