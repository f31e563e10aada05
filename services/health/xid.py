"""Pure core: parse NVRM Xid kernel lines, and split kernel-log input into lines.

The driver logs every Xid as one kernel line, e.g.

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.

and the probe reads it from /dev/kmsg (`6,1234,5678,-;NVRM: ...`), dmesg
(`[12345.678901] NVRM: ...`), journald (`Nov 29 ... kernel: NVRM: ...`) or a file. Forms
handled: with and without `pid=`/`name=` (pre-r470 drivers print only hex words),
`pid='<unknown>'`, MIG instances (`PCI:0000:3b:00 GPU-I:05 GPU-CI:01`), very old drivers
without the `PCI:` tag. Anything else, garbage or a truncated line, gives None: this code
reads untrusted text and never raises on it.
"""

from __future__ import annotations

import re

import msgspec

from services.health.gpu import PciAddress

# The Xid number must be followed by "," (every driver prints one), so a line cut off in
# the middle of "79" is not read as Xid 7.
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
    r"(?P<mig>(?: GPU-C?I:\s*\d{1,3})*)\): (?P<xid>\d{1,5}),\s?(?P<rest>.*)$"
)
_MIG_RE = re.compile(r"GPU-(?P<kind>C?I):\s*(?P<id>\d{1,3})")
_PID_RE = re.compile(r"^pid=(?P<pid>'?<unknown>'?|\d{1,10})(?:, |,|$)")
_NAME_RE = re.compile(r"^name=(?P<name>[^,]*)(?:, |,|$)")
_UNKNOWN = ("<unknown>", "'<unknown>'", "")
_KMSG_PREFIX_RE = re.compile(r"^(?P<pri>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")
MAX_LINE = 8192  # the kernel caps one printk record at 1024 bytes; be generous


class XidRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One Xid as the kernel log reported it. `pci` has function 0 (lines omit it)."""

    pci: PciAddress
    xid: int
    pid: int | None = None
    process: str | None = None
    gpu_instance: int | None = None  # MIG GPU instance id
    compute_instance: int | None = None  # MIG compute instance id
    message: str = ""


class KmsgRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One /dev/kmsg record header and message."""

    priority: int  # facility * 8 + level
    sequence: int  # a gap in sequence means the ring buffer overwrote records
    at_usec: int  # CLOCK_MONOTONIC microseconds when logged
    message: str


def parse_xid_line(line: str) -> XidRecord | None:
    """The Xid in one kernel-log line, or None when the line holds no complete Xid."""
    if len(line) > MAX_LINE:
        return None
    match = _XID_RE.search(line.rstrip("\r\n"))
    if match is None:
        return None
    pci = PciAddress.try_parse(match["pci"])
    xid = int(match["xid"])
    if pci is None or xid == 0:
        return None
    gpu_instance, compute_instance = _mig_ids(match["mig"])
    pid, process, message = _pid_name_message(match["rest"])
    return XidRecord(
        pci=pci,
        xid=xid,
        pid=pid,
        process=process,
        gpu_instance=gpu_instance,
        compute_instance=compute_instance,
        message=message.strip(),
    )


def _mig_ids(text: str) -> tuple[int | None, int | None]:
    ids: dict[str, int] = {}
    for m in _MIG_RE.finditer(text):
        ids.setdefault(m["kind"], int(m["id"]))
    return ids.get("I"), ids.get("CI")


def _pid_name_message(rest: str) -> tuple[int | None, str | None, str]:
    pid: int | None = None
    process: str | None = None
    pid_match = _PID_RE.match(rest)
    if pid_match is None:
        return None, None, rest  # old drivers: no pid=/name=, only the message
    if pid_match["pid"].isdigit():
        pid = int(pid_match["pid"])
    rest = rest[pid_match.end() :]
    name_match = _NAME_RE.match(rest)
    if name_match is not None:
        name = name_match["name"].strip().strip("'")
        process = None if name in _UNKNOWN else name
        rest = rest[name_match.end() :]
    return pid, process, rest


def parse_kmsg_record(record: str) -> KmsgRecord | None:
    """Split a /dev/kmsg record ("pri,seq,usec,flags[,..];message"). Continuation lines
    (" SUBSYSTEM=pci", dictionary entries) and malformed records give None."""
    first = record.split("\n", 1)[0]
    match = _KMSG_PREFIX_RE.match(first)
    if match is None:
        return None
    return KmsgRecord(
        priority=int(match["pri"]),
        sequence=int(match["seq"]),
        at_usec=int(match["usec"]),
        message=match["msg"],
    )


def split_lines(pending: str, chunk: str, *, max_line: int = MAX_LINE) -> tuple[list[str], str]:
    """Feed `chunk` after the unfinished `pending` text; return the complete lines and the
    new unfinished tail. A tail longer than `max_line` is dropped (no newline will ever
    make it an Xid line), so a runaway writer cannot grow memory."""
    text = pending + chunk
    *lines, tail = text.split("\n")
    if len(tail) > max_line:
        tail = ""
    return [line.rstrip("\r") for line in lines], tail


def sequence_gap(previous: int | None, record: KmsgRecord) -> int:
    """How many kmsg records were lost between `previous` and `record` (0 when none)."""
    if previous is None or record.sequence <= previous:
        return 0
    return record.sequence - previous - 1
