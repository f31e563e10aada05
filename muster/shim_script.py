"""Plumbing: the text of one Slurm-named wrapper that `muster shims DIR` writes.

A wrapper is a /bin/sh script that execs the interpreter with `-S`: no `site` start-up,
which costs a one-shot `squeue` more than its request does (an editable install's path
finder alone loads pathlib, urllib and re). What site would have added to the import
path is written into the wrapper instead: the interpreter's site-packages, `.pth` and
user-site entries (read from it once, here) and the folders holding this project's
packages. The current folder is left off the path (a job's folder may hold a
`shared/`), PYTHONPATH and the other PYTHON* variables still apply. An interpreter
that cannot be asked (not there yet, say) gets the plain `python -m muster.shims NAME`.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

PROBE = "import json, sys; print(json.dumps(sys.path))"
PACKAGES = ("muster", "shared", "services")  # what the shims import (sacct: services')


def _path_of(python: str, *flags: str) -> list[str]:
    """`python`'s import path with `flags`, without the environment's or the current
    folder's entries (-E -P): what it finds on its own."""
    out = subprocess.run(
        [python, "-E", "-P", *flags, "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [str(p) for p in json.loads(out.stdout)]


def project_roots() -> list[str]:
    """The folders this process imports the project's packages from."""
    import importlib

    roots: list[str] = []
    for name in PACKAGES:
        for folder in importlib.import_module(name).__path__:
            if (root := os.path.dirname(os.path.abspath(folder))) not in roots:
                roots.append(root)
    return roots


def site_paths(python: str) -> list[str] | None:
    """What `python -S` lacks of its usual import path, then the project's folders;
    None when `python` cannot be run."""
    try:
        bare = set(_path_of(python, "-S"))
        full = _path_of(python)
    except (OSError, subprocess.SubprocessError, ValueError):  # JSON's error is a ValueError
        return None
    # folders and zips only: an editable install's finder marks its hook with a name
    extra = [p for p in full if p not in bare and os.path.exists(p)]
    return extra + [r for r in project_roots() if r not in extra]


def shim_text(python: str, name: str, paths: list[str] | None) -> str:
    """The wrapper for shim `name`: `python -S`, `paths` appended to its import path,
    then `muster.shims.main` with `name` and the wrapper's arguments."""
    if paths is None:
        return f'#!/bin/sh\nexec "{python}" -m muster.shims {name} "$@"\n'
    code = (
        f"import sys; sys.path = [p for p in sys.path if p] + {json.dumps(paths)}; "
        "from muster.lean import shim_main; sys.exit(shim_main())"
    )
    return (
        "#!/bin/sh\n"
        f"# {name} on Muster, written by `muster shims` for this interpreter and checkout\n"
        f'exec {shlex.quote(python)} -S -c {shlex.quote(code)} {name} "$@"\n'
    )
