"""Pure: `scontrol show hostnames` and `scontrol show hostlist[sorted]` (muster/shims.py).

The first line of most multi-node Slurm training scripts,

    MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)

expands a hostlist into one name per line, in the order written; with no list, the job's
own (`SLURM_JOB_NODELIST`). `hostlist` and `hostlistsorted` go the other way: names (a
comma list, or a file named by an absolute path, one or more names a line) into one
hostlist expression. Both answer from their arguments alone, without the cluster: they
run inside jobs, on nodes, as often as a script likes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from services.admission.hostlist import compress, expand

ENTITIES = ("hostnames", "hostname", "hostlist", "hostlistsorted")


class HostlistError(ValueError):
    """What to write instead; the shim prints it as scontrol's error."""


def show(
    entity: str, args: Sequence[str], env: Mapping[str, str], read: Callable[[str], str]
) -> list[str]:
    """The lines `scontrol show ENTITY ARGS` prints (`read`: a file's text, for the
    absolute path `hostlist` may be given)."""
    if len(args) > 1:
        raise HostlistError(f"show {entity} takes one list, not {len(args)}: join them with ','")
    given = args[0] if args else None
    if entity in ("hostnames", "hostname"):
        expr = given if given is not None else env.get("SLURM_JOB_NODELIST", "")
        names = _expand(expr)
        if not names:
            raise HostlistError(
                "no hostlist given and SLURM_JOB_NODELIST is not set: write"
                " `scontrol show hostnames node[01-04]`, or run it inside a job"
            )
        return list(names)
    if given is None:
        raise HostlistError(f"show {entity} needs names: node01,node02 (or /path/to/file)")
    text = given
    if given.startswith("/"):
        try:
            text = read(given)
        except OSError as err:
            raise HostlistError(f"cannot read {given}: {err.strerror}") from err
    names = _expand(",".join(text.split()))
    if not names:
        raise HostlistError(f"show {entity}: {given!r} names no host")
    return [compress(names)]


def _expand(expr: str) -> tuple[str, ...]:
    try:
        return expand(expr)
    except ValueError as err:
        raise HostlistError(str(err)) from err
