"""PCI addresses: every spelling parses to the same integers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.health.gpu import PciAddress

A = PciAddress(domain=0, bus=0x3B, device=0, function=0)

PARSE: dict[str, tuple[str, PciAddress]] = {
    "lspci -D": ("0000:3b:00.0", A),
    "NVML busId: eight-digit domain, upper case": ("00000000:3B:00.0", A),
    "NVRM xid lines carry no function": ("0000:3b:00", A),
    "lspci without a domain": ("3b:00.0", A),
    "surrounding blanks": ("  0000:3b:00.0\n", A),
    "a function and a device": (
        "0001:af:1f.7",
        PciAddress(domain=1, bus=0xAF, device=0x1F, function=7),
    ),
}


@pytest.mark.parametrize(("text", "want"), PARSE.values(), ids=PARSE.keys())
def test_parse(text: str, want: PciAddress) -> None:
    assert PciAddress.parse(text) == want


BAD = {
    "empty": "",
    "no bus": "0000:.0",
    "device above 0x1f": "0000:3b:20.0",
    "function above 7": "0000:3b:00.8",
    "not hex": "0000:zz:00.0",
    "nine-digit domain": "000000000:3b:00.0",
}


@pytest.mark.parametrize("text", BAD.values(), ids=BAD.keys())
def test_parse_rejects_with_a_message_naming_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="PCI"):
        PciAddress.parse(text)
    assert PciAddress.try_parse(text) is None


def test_addresses_compare_by_integers_not_text() -> None:
    assert PciAddress.parse("0000:0a:00.0") < PciAddress.parse("0000:3b:00.0")
    assert PciAddress.parse("0000:3b:00.0") < PciAddress.parse("0001:00:00.0")
    assert sorted([PciAddress.parse("0000:B3:00.0"), PciAddress.parse("0000:1b:00")]) == [
        PciAddress(bus=0x1B, device=0),
        PciAddress(bus=0xB3, device=0),
    ]


def test_slot_drops_the_function() -> None:
    assert PciAddress.parse("0000:3b:00.3").slot == A


@given(
    domain=st.integers(0, 0xFFFF),
    bus=st.integers(0, 0xFF),
    device=st.integers(0, 0x1F),
    function=st.integers(0, 7),
)
def test_str_round_trips(domain: int, bus: int, device: int, function: int) -> None:
    a = PciAddress(domain=domain, bus=bus, device=device, function=function)
    assert PciAddress.parse(str(a)) == a
