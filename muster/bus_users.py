"""Shell: `python -m muster.bus_users AUTH_FILE` — an operator's step on a real cluster:
render the users' entries of the bus's authorization file (between its marker lines,
deploy/nats/authorization.conf) from the cluster configuration's `[users.NAME] keys`,
one NATS user per key that may request `muster.api.*` and read `_INBOX.<NAME>.>` only;
then reload the servers (`nats-server --signal reload`, or `--reload PID` here, which
sends the same SIGHUP). A local cluster needs none of this: its admission does it
(services/admission/bus_users.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from shared import bus_auth
from shared.identity_files import directory_from_toml, read_key_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m muster.bus_users", description=__doc__)
    p.add_argument("auth_file", help="the authorization file the NATS servers include")
    p.add_argument("--config", help="the cluster configuration (default MUSTER_CLUSTER_CONFIG)")
    p.add_argument("--keys-dir", default="", help="a folder of NAME.pub files, also honoured")
    p.add_argument("--reload", type=int, action="append", default=[], metavar="PID",
                   help="SIGHUP this nats-server after writing (repeatable)")  # fmt: skip
    args = p.parse_args(argv)
    config = args.config or os.environ.get("MUSTER_CLUSTER_CONFIG", "")
    if not config:
        p.error("name the cluster configuration: --config FILE or MUSTER_CLUSTER_CONFIG")
    path = Path(args.auth_file)
    try:
        directory = directory_from_toml(Path(config).read_text(), read_key_dir(args.keys_dir))
        text = path.read_text()
        new = bus_auth.with_users(text, bus_auth.user_bus_users(directory.users_by_key))
    except (OSError, ValueError) as err:
        print(f"muster.bus_users: {err}", file=sys.stderr)
        return 1
    if new != text:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(new)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    for pid in args.reload:
        os.kill(pid, signal.SIGHUP)
    keys = len(directory.users_by_key)
    state = "updated" if new != text else "unchanged"
    print(f"{path}: {state}, {keys} user key(s); reload the NATS servers to apply it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
