#!/bin/sh
# Removes the job's scratch folder made by prolog.d/20-scratch.sh.
set -eu
root=${MUSTER_SCRATCH_ROOT:-/scratch}
dir="$root/${SLURM_JOB_USER:?}/${SLURM_JOB_ID:?}"
[ -d "$dir" ] && rm -rf --one-file-system -- "$dir"
exit 0
