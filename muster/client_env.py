"""Shell: where a command finds its cluster, its key and its bus credentials, from the
environment and the local cluster's state folder (see muster.client's docstring for the
order). Apart from muster.client so the lean commands (muster.lean) read them without
loading msgspec or the API's structs."""

from __future__ import annotations

import os

from shared.bus_inbox import user_inbox
from shared.lean_json import loads

# Where a state folder keeps the operator's bus credential, as shared.security names it
# (that module's openssl and ssl imports stay off the CLI's path).
SECRETS = "secrets"

_state_of: dict[str, str] = {}  # a cluster's URL -> its state folder (from cluster.json)


class NoCluster(SystemExit):
    """Neither MUSTER_NATS_URL nor a local cluster's cluster.json says where the bus is."""

    def __init__(self) -> None:
        super().__init__("no cluster: run `muster up` here, or set MUSTER_NATS_URL")


def state_dir() -> str:
    return os.environ.get("MUSTER_STATE_DIR", ".muster")


def nats_url(folder: str | None = None) -> str:
    if url := os.environ.get("MUSTER_NATS_URL"):
        return url
    folder = folder or state_dir()
    cluster = os.path.join(folder, "cluster.json")
    if os.path.exists(cluster):
        with open(cluster, "rb") as f:
            url = str(loads(f.read())["nats_url"])
        _state_of[url] = folder
        return url
    raise NoCluster()


def current_user() -> str:
    """The user a request names: `MUSTER_USER`, or "" (the server takes it from the key)."""
    return os.environ.get("MUSTER_USER", "")


def default_key_path() -> str:
    return os.path.join(os.path.expanduser("~"), ".muster", "user.nk")


def key_path(user: str) -> str:
    """The key file that signs for `user` (see muster.client's docstring for the order)."""
    if path := os.environ.get("MUSTER_KEY_FILE"):
        return path
    name = user_name(user)
    state = os.path.join(state_dir(), "keys")
    for folder in (os.environ.get("MUSTER_KEY_DIR"), state):
        if folder and os.path.exists(candidate := os.path.join(folder, f"{name}.nk")):
            return candidate
    return default_key_path()


def user_name(user: str = "") -> str:
    """Who this command acts as: `user`, else `MUSTER_USER`, else the login name."""
    return user or os.environ.get("MUSTER_USER") or login_name()


def login_name() -> str:
    """getpass.getuser()'s answer, without its imports (contextlib, warnings, termios)."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if user := os.environ.get(name):
            return user
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def register_cluster(url: str, folder: str | os.PathLike[str]) -> None:
    """Connect to `url` with the credentials of the cluster in `folder`."""
    _state_of[url] = os.fspath(folder)


def bus_credentials(url: str, *, operator: bool = False, user: str = "") -> tuple[str, str, str]:
    """(NKey seed file, TLS CA file, inbox prefix) to connect to the cluster at `url`
    with, acting as `user` (see muster.client's docstring). The bus knows a user by the
    key their requests are signed with, so that key file is the credential (unless
    `MUSTER_NATS_CREDS` names another; "" when there is none: an open bus needs none),
    and their replies come to `_INBOX.<user>` (`MUSTER_NATS_INBOX_PREFIX` overrides)."""
    folder = _state_of.get(url) or state_dir()
    creds = os.environ.get("MUSTER_NATS_CREDS", "")
    admin = os.path.join(folder, SECRETS, "nats-admin.nk")
    if operator and os.access(admin, os.R_OK):
        creds = admin
    elif not creds and os.path.exists(key := key_path(user)):
        creds = key
    ca = os.environ.get("MUSTER_NATS_TLS_CA", "")
    if not ca and os.path.exists(pem := os.path.join(folder, "tls", "ca.pem")):
        ca = pem
    inbox = os.environ.get("MUSTER_NATS_INBOX_PREFIX") or user_inbox(user_name(user))
    return creds, ca, inbox


def local_ids(name: str) -> tuple[int, str, int] | None:
    """The uid, group name and gid this machine knows user `name` by (scontrol's
    `UserId=alice(1001) GroupId=ml(2001)`); None for a user it has no account of."""
    import grp
    import pwd

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    try:
        group = grp.getgrgid(entry.pw_gid).gr_name
    except KeyError:
        group = str(entry.pw_gid)
    return entry.pw_uid, group, entry.pw_gid
