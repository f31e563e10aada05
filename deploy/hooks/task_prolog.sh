#!/bin/sh
# Muster TaskProlog (MUSTER_TASK_PROLOG=/etc/muster/hooks/task_prolog.sh): runs as the
# job's user just before its program, in the job's environment. Lines it prints set it:
# "export NAME=value", "unset NAME", "print text" (to the job's output), as in Slurm.
scratch="${MUSTER_SCRATCH_ROOT:-/scratch}/$SLURM_JOB_USER/$SLURM_JOB_ID"
[ -d "$scratch" ] && echo "export TMPDIR=$scratch"
pkey="/run/muster/pkey.$SLURM_JOB_ID"
[ -r "$pkey" ] && echo "export NCCL_IB_PKEY=$(cat "$pkey")"
exit 0
