#!/bin/sh
# Muster Prolog (MUSTER_PROLOG=/etc/muster/hooks/prolog.sh): runs as root on each node
# of a job before its first process there, with SLURM_JOB_ID, SLURM_JOB_USER,
# SLURM_JOB_PARTITION, SLURM_JOB_NODELIST, CUDA_VISIBLE_DEVICES and SLURMD_NODENAME.
# A non-zero exit (or a hang past MUSTER_HOOK_TIMEOUT_S) drains this node with the last
# line printed as the reason and requeues the job, as Slurm does. Runs every script of
# prolog.d/ in order and stops at the first failure.
set -eu
here=$(dirname "$0")
for hook in "$here"/prolog.d/*; do
    [ -x "$hook" ] || continue
    "$hook" || { echo "$(basename "$hook") failed"; exit 1; }
done
