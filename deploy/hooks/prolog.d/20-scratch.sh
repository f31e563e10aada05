#!/bin/sh
# A private scratch folder per job on node-local storage, owned by the job's user:
# /scratch/$SLURM_JOB_USER/$SLURM_JOB_ID (MUSTER_SCRATCH_ROOT overrides /scratch).
# The job finds it at the same path; epilog.d/20-scratch.sh removes it.
set -eu
root=${MUSTER_SCRATCH_ROOT:-/scratch}
[ -d "$root" ] || exit 0
dir="$root/$SLURM_JOB_USER/$SLURM_JOB_ID"
install -d -m 0700 -o "$SLURM_JOB_USER" "$root/$SLURM_JOB_USER"
install -d -m 0700 -o "$SLURM_JOB_USER" "$dir"
