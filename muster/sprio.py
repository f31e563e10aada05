"""Pure core of the `sprio` shim (muster/shims.py): each pending job's multifactor
priority and its weighted factors, as fairshare last ranked it, in Slurm's columns.

    sprio [-j JOBS] [-u USERS] [-p PARTITIONS] [-l] [-h] [-o FORMAT]

Letters `%i` job, `%r` partition, `%u` user, `%Y` priority, `%S` site (0: Muster has no
site factor), `%A` age, `%F` fair share, `%J` job size, `%P` partition, `%Q` QOS, `%N`
nice, each a whole number as Slurm prints them. A job fairshare has not ranked yet (just
submitted) is not listed, as Slurm's lists only jobs with a priority.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from muster.slurm_format import parse_percent, render

if TYPE_CHECKING:
    from muster.slurm_format import Column
    from shared.api import JobView


def _factor(name: str) -> Column:
    return (name.upper(), lambda j: f"{j.priority.get(name, 0.0):.0f}")


COLUMNS: dict[str, Column] = {
    "jobid": ("JOBID", lambda j: str(j.job_id)),
    "partition": ("PARTITION", lambda j: j.partition),
    "user": ("USER", lambda j: j.user),
    "priority": ("PRIORITY", lambda j: f"{j.priority.get('total', 0.0):.0f}"),
    "site": ("SITE", lambda j: "0"),
    "age": _factor("age"),
    "fairshare": _factor("fairshare"),
    "jobsize": _factor("jobsize"),
    "partitionprio": ("PARTITION", lambda j: f"{j.priority.get('partition', 0.0):.0f}"),
    "qos": _factor("qos"),
    "nice": _factor("nice"),
}
LETTERS = {
    "i": "jobid", "r": "partition", "u": "user", "Y": "priority", "S": "site", "A": "age",
    "F": "fairshare", "J": "jobsize", "P": "partitionprio", "Q": "qos", "N": "nice",
}  # fmt: skip
DEFAULT = "%.15i %9r %.10Y %.10S %.10A %.10F %.10J %.10P %.10Q"  # Slurm's
LONG = "%.15i %9r %.8u %.10Y %.10S %.10A %.10F %.10J %.10P %.10Q %.6N"


def sprio_lines(jobs: Sequence[JobView], fmt: str | None, long: bool, header: bool) -> list[str]:
    """A line per pending job with a priority, by job id."""
    ranked = sorted((j for j in jobs if j.priority), key=lambda j: j.job_id)
    parts = parse_percent(fmt or (LONG if long else DEFAULT), LETTERS)
    return render(parts, ranked, COLUMNS, header=header)
