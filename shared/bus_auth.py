"""Pure core: who may publish and subscribe to what on the bus, and the nats-server
`authorization` block that says so.

One NATS user (an NKey: the server holds only public keys, the client answers the
server's challenge with its seed, so no password crosses the wire or sits in the server
config) per identity:

- one per registered user key: the user's API signing key (`muster keygen`, registered
  with `muster user add NAME --key U...`) is also their bus key. It may only request
  `muster.api.*` and receive the replies on its own inboxes, `_INBOX.<name>.>`, so no
  user reads another's replies (their scripts, environments, accounting), and on its own
  terminal subjects (`srun --pty`: `muster.pty.<name>.<hex>.in` to type, `.out` to
  read). Who the user is for the API still comes from each request's signature
  (shared/identity.py).
- one per service kind (admission, placer, launcher, health, fairshare): the JetStream
  API, acks, the dead-letter subjects, the events the service owns (docs/architecture.md,
  "Processes") and the agent verbs it calls.
- one per node agent: its heartbeats, the events agents emit, requests on its own
  `muster.agent.<node>.>` subjects only, and the terminals of the `srun --pty` steps it
  runs (`muster.pty.*.*.out` out, `.in` in; the launcher hands it only a terminal
  subject of the step's own user).
- `admin`: everything (an operator's tool: `muster inject-fault`, tests).

Every service and agent draws its inboxes from its own prefix (`_I.<identity>`), and
every user from theirs (`_INBOX.<name>`), so nobody sees the JetStream deliveries of the
services' pull consumers (scripts and environments travel in `job.submitted`), the
agents' replies to the services, or another user's replies.

The users' entries sit between two marker lines of the block (`USERS_BEGIN`,
`USERS_END`), so they can be rendered again when keys are registered or removed
(`with_users`) while the rest of the file stays as written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from enum import StrEnum

import msgspec

from shared.api import AGENT_PREFIX, API_PREFIX, HEARTBEAT_PREFIX
from shared.bus_inbox import PTY_PREFIX, USERS_INBOX, user_pty
from shared.bus_inbox import user_inbox as user_inbox  # the rule's one home; re-exported
from shared.events import NODE_SUBJECT_TAGS, node_subject


class Kind(StrEnum):
    USER = "user"
    SERVICE = "service"
    AGENT = "agent"
    ADMIN = "admin"


SERVICES = ("admission", "placer", "launcher", "health", "fairshare")

# The events each service owns (publishes through its outbox), as the subject suffix.
SERVICE_EVENTS: dict[str, tuple[str, ...]] = {
    "admission": (
        "job.submitted",
        "job.cancel_requested",
        "job.limit_changed",
        "job.requeue_requested",
        "node.drain_requested",
    ),
    "placer": ("job.allocated", "job.preempt_requested", "job.spares_answered"),
    "launcher": (
        "job.started",
        "job.finished",
        "job.requeued",
        "job.reconfigured",
        "job.spares_requested",
        "job.node_lost",
        "usage.ticked",
        "node.cleaned",
    ),
    "health": ("node.fault", "node.down", "node.recovered"),
    "fairshare": (),
}
# The node agent verbs each service calls (`muster.agent.<node>.<verb>`).
# Admission asks none: a signal (`scancel -s`) goes through the job's coordinator, whose
# requests are the only ones an agent takes (signed, shared/agent_auth.py).
SERVICE_AGENT_VERBS: dict[str, tuple[str, ...]] = {
    "launcher": ("start", "stop", "status", "port", "step", "step_stop"),  # docs/steps.md
    "health": ("reset",),
}
# What a service serves or listens to on core NATS.
SERVICE_LISTENS: dict[str, tuple[str, ...]] = {
    "admission": (API_PREFIX + "*",),
    "fairshare": (
        API_PREFIX + "share",
        API_PREFIX + "acct",
        API_PREFIX + "report",
        API_PREFIX + "cluster_report",
        API_PREFIX + "sizes_report",
    ),
    "launcher": (API_PREFIX + "step", API_PREFIX + "step_cancel"),  # srun (docs/steps.md)
    "health": (HEARTBEAT_PREFIX + "*",),
}
# What a node agent publishes, each on its own node's subject only (`muster.<tag>.<node>`,
# shared/events.py): an agent cannot speak for another node on the bus.
AGENT_EVENTS = NODE_SUBJECT_TAGS
EVENT_PREFIX = "muster."
USERS_BEGIN = "    # --- users: one entry per registered key (rendered from the cluster config) ---"
USERS_END = "    # --- end of users ---"
_NKEY = re.compile(r'nkey:\s*"([^"]+)"')


class Permissions(msgspec.Struct, frozen=True, kw_only=True):
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    allow_responses: bool = False
    everything: bool = False  # admin: no permissions block at all


class BusUser(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # "users", "admin", "admission", "node-node01", ...
    nkey: str  # the public key, U...
    permissions: Permissions


def inbox_prefix(name: str) -> str:
    """The inbox prefix service or agent identity `name` uses (and alone may subscribe
    to); the operator's `admin` may use any, and keeps nats-py's default."""
    return USERS_INBOX if name == Kind.ADMIN else f"_I.{name}"


def owned_subjects(service: str) -> tuple[str, ...]:
    """The event subjects `service` publishes (its relay publishes only these rows)."""
    return tuple(EVENT_PREFIX + tag for tag in SERVICE_EVENTS.get(service, ()))


def relay_subjects(service: str) -> tuple[str, ...] | None:
    """What `service`'s outbox relay publishes on a secured bus: its own events (None, all
    rows, for a process this table does not know)."""
    return owned_subjects(service) if service in SERVICE_EVENTS else None


def user_permissions(user: str) -> Permissions:
    """A user requests `muster.api.*` and reads their own inboxes; on their own terminal
    subjects (`srun --pty`) they type (`.in`) and read (`.out`)."""
    pty = user_pty(user)
    return Permissions(
        publish=(API_PREFIX + "*", f"{pty}.*.in"),
        subscribe=(user_inbox(user) + ".>", f"{pty}.*.out"),
    )


def user_bus_users(users_by_key: Mapping[str, str]) -> tuple[BusUser, ...]:
    """One bus user per registered key (public key -> user, as the identity directory
    maps them), in a stable order; a key that is not a user public key is left out (the
    server would refuse the whole file, and with it every identity)."""
    from shared.identity import public_key_bytes

    out = []
    for key, user in sorted(users_by_key.items(), key=lambda kv: (kv[1], kv[0])):
        try:
            public_key_bytes(key)
        except ValueError:
            continue
        out.append(BusUser(name=f"user {user}", nkey=key, permissions=user_permissions(user)))
    return tuple(out)


def service_permissions(service: str) -> Permissions:
    if service not in SERVICE_EVENTS:
        raise ValueError(f"unknown service {service!r}; one of {', '.join(SERVICES)}")
    verbs = SERVICE_AGENT_VERBS.get(service, ())
    publish = (
        "$JS.API.>",
        "$JS.ACK.>",
        "muster.dlq.>",
        *owned_subjects(service),
        *(f"{AGENT_PREFIX}*.{verb}" for verb in verbs),
    )
    subscribe = (inbox_prefix(service) + ".>", *SERVICE_LISTENS.get(service, ()))
    return Permissions(publish=publish, subscribe=subscribe, allow_responses=True)


def agent_permissions(node: str) -> Permissions:
    # `srun --pty` relays: a step's terminal output out, its user's keys in (the launcher
    # only hands an agent a terminal subject of the step's own user)
    publish = (
        HEARTBEAT_PREFIX + node,
        *(node_subject(tag, node) for tag in AGENT_EVENTS),
        f"{PTY_PREFIX}.*.*.out",
    )
    subscribe = (
        inbox_prefix(agent_name(node)) + ".>",
        f"{AGENT_PREFIX}{node}.>",
        f"{PTY_PREFIX}.*.*.in",
    )
    return Permissions(publish=publish, subscribe=subscribe, allow_responses=True)


def agent_name(node: str) -> str:
    return f"node-{node}"


def render_authorization(
    users: Iterable[BusUser], user_keys: Iterable[BusUser] = (), *, timeout_s: float = 5.0
) -> str:
    """The nats-server `authorization { users = [...] }` block for `users` (services,
    agents, admin) and `user_keys` (`user_bus_users`: between the markers)."""
    users = tuple(users)
    taken = {u.nkey for u in users}
    lines = ["authorization {", f"  timeout: {timeout_s:g}", "  users = ["]
    lines += _entries(users)
    lines += [USERS_BEGIN, *_entries(u for u in user_keys if u.nkey not in taken), USERS_END]
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def with_users(text: str, user_keys: Iterable[BusUser]) -> str:
    """`text` (an authorization file with the marker lines) with the users' entries
    between them replaced by `user_keys`; ValueError when a marker is missing."""
    lines = text.splitlines()
    try:
        begin, end = lines.index(USERS_BEGIN), lines.index(USERS_END)
    except ValueError as err:
        raise ValueError(
            f"no users section: the file needs the lines {USERS_BEGIN.strip()!r} and "
            f"{USERS_END.strip()!r} inside `users = [ ... ]`"
        ) from err
    if end < begin:
        raise ValueError("the users section's end marker comes before its start")
    # A key the file already gives an identity (a service's, admin's) is never a user's
    # too: NATS refuses a file naming one key twice, and with it every identity.
    taken = {m for line in (*lines[:begin], *lines[end:]) for m in _NKEY.findall(line)}
    mine = _entries(u for u in user_keys if u.nkey not in taken)
    return "\n".join([*lines[: begin + 1], *mine, *lines[end:]]) + "\n"


def _entries(users: Iterable[BusUser]) -> list[str]:
    lines = []
    for user in users:
        # a comment of one line whatever the name holds (a user name is a TOML key)
        lines.append("    # " + "".join(c if c.isprintable() else "?" for c in user.name))
        lines.append(
            "    {" + f' nkey: "{user.nkey}"' + _render_permissions(user.permissions) + " }"
        )
    return lines


def _render_permissions(p: Permissions) -> str:
    if p.everything:
        return ""
    parts = [
        f"publish: {{ allow: {_list(p.publish)} }}",
        f"subscribe: {{ allow: {_list(p.subscribe)} }}",
    ]
    if p.allow_responses:
        parts.append("allow_responses: true")
    return ", permissions: { " + ", ".join(parts) + " }"


def _list(subjects: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{s}"' for s in subjects) + "]"
