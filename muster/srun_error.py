"""srun's one error: what it prints after `srun: error:` before it exits 1 (shared by
muster/steps.py, srun inside a job, and muster/srun_alloc.py, srun making a job)."""


class SrunError(Exception):
    """What srun prints after `srun: error:` before it exits 1."""
