"""NVRM Xid line parsing: every real form, garbage, truncation; kmsg helpers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.health.gpu import PciAddress
from services.health.xid import (
    KmsgRecord,
    XidRecord,
    parse_kmsg_record,
    parse_xid_line,
    sequence_gap,
    split_lines,
)

B3B = PciAddress(bus=0x3B, device=0)


def rec(xid: int, message: str, **kw: object) -> XidRecord:
    return XidRecord(pci=kw.pop("pci", B3B), xid=xid, message=message, **kw)  # type: ignore[arg-type]


LINES: dict[str, tuple[str, XidRecord | None]] = {
    "a bare r535 line with pid and name": (
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        rec(79, "GPU has fallen off the bus.", pid=1234, process="python"),
    ),
    "a /dev/kmsg record keeps its prefix": (
        "6,1234,5678,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
        "GPU has fallen off the bus.",
        rec(79, "GPU has fallen off the bus.", pid=1234, process="python"),
    ),
    "a dmesg line has a timestamp in brackets": (
        "[12345.678901] NVRM: Xid (PCI:0000:3b:00): 13, pid=2001, name=pt_main_thread, "
        "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
        rec(
            13,
            "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
            pid=2001,
            process="pt_main_thread",
        ),
    ),
    "dmesg -T has a wall-clock timestamp": (
        "[Sun Nov 29 15:17:45 2026] NVRM: Xid (PCI:0000:3b:00): 31, pid=77, name=train.py, "
        "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted",
        rec(
            31,
            "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted",
            pid=77,
            process="train.py",
        ),
    ),
    "journald puts host and kernel: in front": (
        "Nov 29 15:17:45 gpu-node-07 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=900, "
        "name=python3, An uncorrectable double bit error (DBE) has been detected on GPU.",
        rec(
            48,
            "An uncorrectable double bit error (DBE) has been detected on GPU.",
            pid=900,
            process="python3",
        ),
    ),
    "a MIG line names the GPU and compute instance": (
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:05 GPU-CI:01): 13, pid=4242, name=python, "
        "Graphics Exception: ESR 0x514648=0x1000000e",
        rec(
            13,
            "Graphics Exception: ESR 0x514648=0x1000000e",
            pid=4242,
            process="python",
            gpu_instance=5,
            compute_instance=1,
        ),
    ),
    "a MIG line may name only the GPU instance": (
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:02): 31, pid=10, name=a.out, MMU Fault",
        rec(31, "MMU Fault", pid=10, process="a.out", gpu_instance=2),
    ),
    "old drivers print hex words instead of pid and name": (
        "NVRM: Xid (PCI:0000:3b:00): 62, 0d6b(2c40) 00000000 00000000 00000000 00000000",
        rec(62, "0d6b(2c40) 00000000 00000000 00000000 00000000"),
    ),
    "an unknown pid is quoted": (
        "NVRM: Xid (PCI:0000:3b:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: "
        "New row (0x000000000013d3c0) marked for remapping, reset gpu to activate.",
        rec(
            63,
            "Row Remapper: New row (0x000000000013d3c0) marked for remapping, "
            "reset gpu to activate.",
        ),
    ),
    "a pid without a name": (
        "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for "
        "remapping, reset gpu to activate.",
        rec(
            63,
            "Row Remapper: New row marked for remapping, reset gpu to activate.",
            pci=PciAddress(bus=0x10, device=0x1C),
            pid=1896,
        ),
    ),
    "an NVLink error keeps its parenthesised detail": (
        "NVRM: Xid (PCI:0000:b3:00): 74, pid=3131, name=python, NVLink: fatal error "
        "detected on link 12(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        rec(
            74,
            "NVLink: fatal error detected on link 12(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
            pci=PciAddress(bus=0xB3, device=0),
            pid=3131,
            process="python",
        ),
    ),
    "an upper-case, eight-digit domain and a non-zero domain": (
        "NVRM: Xid (PCI:00000001:3B:00): 119, pid=5, name=x, Timeout after 6s of waiting "
        "for RPC response from GPU0 GSP!",
        rec(
            119,
            "Timeout after 6s of waiting for RPC response from GPU0 GSP!",
            pci=PciAddress(domain=1, bus=0x3B, device=0),
            pid=5,
            process="x",
        ),
    ),
    "Xid 154 carries the new recovery action in the text": (
        "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) "
        "to 0x1 (GPU Reset Required)",
        rec(154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"),
    ),
    "very old drivers omit the PCI: tag": (
        "NVRM: Xid (0000:03:00): 13, 0001 00000000 0000a1c0 00000368 00000000 00000100",
        rec(
            13,
            "0001 00000000 0000a1c0 00000368 00000000 00000100",
            pci=PciAddress(bus=0x03, device=0),
        ),
    ),
    "a trailing newline and CR are ignored": (
        "NVRM: Xid (PCI:0000:3b:00): 45, pid=1, name=p, Ch 00000010\r\n",
        rec(45, "Ch 00000010", pid=1, process="p"),
    ),
    "a line truncated inside the xid number is not read as a shorter xid": (
        "NVRM: Xid (PCI:0000:3b:00): 7",
        None,
    ),
    "a line truncated inside the PCI address": ("NVRM: Xid (PCI:0000:3b", None),
    "a line truncated after the parenthesis": ("NVRM: Xid (PCI:0000:3b:00): ", None),
    "other NVRM lines are not xids": (
        "NVRM: GPU at PCI:0000:3b:00: GPU-5d2e5a6b-3d7c-1b2a-9c8d-112233445566",
        None,
    ),
    "the fallen-off-the-bus follow-up line is not an xid": (
        "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
        None,
    ),
    "garbage": ("\x00\xff}{ NVRM Xid ((( 79", None),
    "an empty line": ("", None),
    "xid zero is not a real xid": ("NVRM: Xid (PCI:0000:3b:00): 0, pid=1, name=p, x", None),
    "an impossible PCI device number": ("NVRM: Xid (PCI:0000:3b:ff): 79, x", None),
}


@pytest.mark.parametrize(("line", "want"), LINES.values(), ids=LINES.keys())
def test_parse_xid_line(line: str, want: XidRecord | None) -> None:
    assert parse_xid_line(line) == want


@given(st.text(max_size=300))
def test_the_parser_never_raises_on_arbitrary_text(text: str) -> None:
    result = parse_xid_line(text)
    assert result is None or result.xid > 0


@given(st.text(max_size=200))
def test_the_parser_never_raises_on_near_misses(tail: str) -> None:
    for head in (
        "NVRM: Xid (PCI:0000:3b:00): ",
        "NVRM: Xid (PCI:",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=",
    ):
        result = parse_xid_line(head + tail)
        assert (
            result is None
            or result.pci == PciAddress(bus=0x3B, device=0)
            or head == "NVRM: Xid (PCI:"
        )


@given(
    prefix=st.sampled_from(["", "[1.0] ", "6,1,2,-;", "host kernel: "]),
    xid=st.integers(1, 99999),
    pid=st.integers(0, 2**31),
    name=st.from_regex(r"[A-Za-z0-9_.\-]{1,15}", fullmatch=True),
    bus=st.integers(0, 255),
)
def test_every_rendered_line_parses_back(
    prefix: str, xid: int, pid: int, name: str, bus: int
) -> None:
    line = f"{prefix}NVRM: Xid (PCI:0000:{bus:02x}:00): {xid}, pid={pid}, name={name}, msg"
    assert parse_xid_line(line) == XidRecord(
        pci=PciAddress(bus=bus, device=0), xid=xid, pid=pid, process=name, message="msg"
    )


KMSG: dict[str, tuple[str, KmsgRecord | None]] = {
    "a record with flags": (
        "4,1234,5678901,-;NVRM: Xid x",
        KmsgRecord(priority=4, sequence=1234, at_usec=5678901, message="NVRM: Xid x"),
    ),
    "a record with extra header fields and a dictionary continuation": (
        "6,77,100,c,extra;hello\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0",
        KmsgRecord(priority=6, sequence=77, at_usec=100, message="hello"),
    ),
    "a continuation line alone": (" SUBSYSTEM=pci", None),
    "not a kmsg record": ("[1.0] hello", None),
}


@pytest.mark.parametrize(("raw", "want"), KMSG.values(), ids=KMSG.keys())
def test_parse_kmsg_record(raw: str, want: KmsgRecord | None) -> None:
    assert parse_kmsg_record(raw) == want


def test_split_lines_keeps_the_unfinished_tail_for_the_next_chunk() -> None:
    lines, tail = split_lines("", "a\nb\r\nc")
    assert (lines, tail) == (["a", "b"], "c")
    lines, tail = split_lines(tail, "d\n")
    assert (lines, tail) == (["cd"], "")


def test_split_lines_drops_a_runaway_tail() -> None:
    assert split_lines("", "x" * 100, max_line=10) == ([], "")


@pytest.mark.parametrize(
    ("previous", "sequence", "want"),
    [(None, 5, 0), (4, 5, 0), (4, 8, 3), (9, 5, 0)],
    ids=["first record", "consecutive", "three lost", "counter restarted"],
)
def test_sequence_gap(previous: int | None, sequence: int, want: int) -> None:
    record = KmsgRecord(priority=6, sequence=sequence, at_usec=0, message="")
    assert sequence_gap(previous, record) == want
