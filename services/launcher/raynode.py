"""Shell: one node of a `--ray` job's Ray cluster, run as the job's worker on each node.

`python -m services.launcher.raynode head|worker --head=HOST:PORT ... -- SCRIPT ARGS`
(the command line comes from `ray_mode.ray_argv`):

- head: `ray start --head --block` with the GCS on PORT; wait until all `--nodes`
  raylets are alive; run the script as the driver with `RAY_ADDRESS=HOST:PORT`; then
  stop every Ray process of this worker and exit with the driver's status.
- worker: `ray start --address=HOST:PORT --block`; live while the head does (its GCS
  port answers); when it is gone, stop this node's Ray processes and exit 0.

Ray's processes stay in this worker's process group (`ray start --block` does not
detach them), so Muster's stop (SIGTERM to the group, SIGKILL after the grace) reaches
them too, and this module's own cleanup stops them when the job ends normally. Nothing
here calls `ray stop`, which would stop every Ray cluster on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from services.launcher.executor import group_members
from services.launcher.wrapper_args import parse_wrapped

JOIN_TIMEOUT_S = 180.0  # every raylet alive, or the head gives up
HEAD_GONE_AFTER = 3  # failed connects in a row (one per second): the head has ended
STOP_GRACE_S = 5.0
# `ray start` gives up after a fixed 30 s when its raylet is slow to register with the
# GCS (a loaded node); it is started again, this many times in all.
START_TRIES = 3


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="raynode")
    p.add_argument("role", choices=["head", "worker"])
    p.add_argument("--head", required=True, help="HOST:PORT of the head's GCS")
    p.add_argument("--address", required=True, help="this node's address")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--cpus", type=int, default=1)
    p.add_argument("--object-store-mib", type=int, default=512)
    p.add_argument("--temp-dir", default="")
    return parse_wrapped(p, argv)


def ray_start(args: argparse.Namespace, ray: str) -> list[str]:
    port = args.head.rsplit(":", 1)[1]
    common = [
        "--block",
        f"--node-ip-address={args.address}",
        f"--num-gpus={args.gpus}",
        f"--num-cpus={args.cpus}",
        f"--object-store-memory={args.object_store_mib * 2**20}",
        "--disable-usage-stats",
    ]
    if args.role == "head":
        extra = [f"--temp-dir={args.temp_dir}"] if args.temp_dir else []
        return [
            ray,
            "start",
            "--head",
            f"--port={port}",
            "--include-dashboard=false",
            *extra,
            *common,
        ]
    return [ray, "start", f"--address={args.head}", *common]


def reachable(endpoint: str) -> bool:
    host, port = endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except OSError:
        return False


def wait_for_nodes(endpoint: str, count: int, raylet: subprocess.Popen[bytes]) -> None:
    """Until `count` raylets are alive in the cluster at `endpoint`."""
    import ray  # the Ray extra; only this process and the driver need it

    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while not reachable(endpoint):
        if raylet.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"raynode: the Ray head did not start at {endpoint}")
        time.sleep(0.5)
    ray.init(address=endpoint, logging_level=logging.ERROR, log_to_driver=False)
    try:
        while True:
            nodes: list[dict[str, object]] = ray.nodes()  # type: ignore[no-untyped-call]
            alive = sum(1 for n in nodes if n.get("Alive"))
            if alive >= count:
                return
            if raylet.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"raynode: {alive} of {count} Ray nodes joined in time")
            time.sleep(0.5)
    finally:
        ray.shutdown()


def stop_group() -> None:
    """SIGTERM to every other process of this worker's group; SIGKILL what is left."""
    me, group = os.getpid(), os.getpgrp()
    others = [p for p in group_members(group) if p != me]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (STOP_GRACE_S if sig == signal.SIGTERM else 1.0)
        while time.monotonic() < deadline:
            others = [p for p in group_members(group) if p != me]
            if not others:
                return
            time.sleep(0.2)


def run(args: argparse.Namespace) -> int:
    ray = str(Path(sys.executable).with_name("ray"))
    if not Path(ray).exists():
        print("raynode: --ray needs Ray on every node: pip install 'muster[ray]'", file=sys.stderr)
        return 2
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        if args.role == "worker":
            return _live_with_head(args, ray, env)
        raylet = _start(args, ray, env)
        wait_for_nodes(args.head, args.nodes, raylet)
        driver = subprocess.Popen(args.command, env={**env, "RAY_ADDRESS": args.head})
        return driver.wait()
    finally:
        stop_group()


def _start(args: argparse.Namespace, ray: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The head's `ray start --block`, started again when it gives up within Ray's own
    fixed 30 s (slow to come up on a busy node) before its GCS answered."""
    raylet = subprocess.Popen(ray_start(args, ray), env=env)
    for _ in range(START_TRIES - 1):
        while raylet.poll() is None:
            if reachable(args.head):
                return raylet
            time.sleep(0.5)
        print(f"raynode: ray start ended ({raylet.returncode}); again", file=sys.stderr)
        stop_group()
        raylet = subprocess.Popen(ray_start(args, ray), env=env)
    return raylet


def _live_with_head(args: argparse.Namespace, ray: str, env: dict[str, str]) -> int:
    """A raylet for as long as the head lives; one that gives up registering (Ray's
    fixed 30 s, a busy node) is started again while the head is there."""
    raylet = subprocess.Popen(ray_start(args, ray), env=env)
    tries, misses, joined = 1, 0, False
    while True:
        code = raylet.poll()
        if reachable(args.head):
            misses, joined = 0, True
        else:
            misses += 1
        if joined and misses >= HEAD_GONE_AFTER:
            return 0  # the head ended: the job's driver is done
        if code is not None:
            if misses == 0 and tries < START_TRIES:
                print(f"raynode: ray start ended ({code}); again", file=sys.stderr)
                stop_group()
                raylet = subprocess.Popen(ray_start(args, ray), env=env)
                tries += 1
                continue
            return 0 if joined and not reachable(args.head) else code or 1
        time.sleep(1.0)


def _stop_on(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through `run`'s cleanup


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _stop_on)
    sys.exit(run(args))


if __name__ == "__main__":
    main()
