#!/bin/sh
# InfiniBand partition key per job (network isolation): the fabric's subnet manager
# (OpenSM / UFM) has a partition per job or per account; this hook checks that the
# partition's P_Key is in this node's HCA port table and makes an IPoIB child interface
# for it, so the job's traffic stays in its partition. Runs only where IB exists.
#
# Site policy decides the key: here MUSTER_IB_PKEY_MAP (a file of "account pkey" or
# "partition pkey" lines, e.g. "research 0x8001"); no map or no entry: nothing to do.
# The job sees the interface as ib0.<pkey> (NCCL_IB_PKEY can name the index, which
# this hook prints to /run/muster/pkey.$SLURM_JOB_ID for a TaskProlog to export).
set -eu
ls /sys/class/infiniband >/dev/null 2>&1 || exit 0          # no HCA: not an IB node
map=${MUSTER_IB_PKEY_MAP:-/etc/muster/ib-pkeys}
[ -r "$map" ] || exit 0
pkey=$(awk -v a="${SLURM_JOB_ACCOUNT:-}" -v p="${SLURM_JOB_PARTITION:-}" \
    '$1 == a || $1 == p { print $2; exit }' "$map")
[ -n "$pkey" ] || exit 0
want=$(printf '0x%04x' $(( pkey | 0x8000 )))                # full membership bit
for port in /sys/class/infiniband/*/ports/*; do
    index=0
    for entry in "$port"/pkeys/*; do
        if [ "$(cat "$entry")" = "$want" ]; then
            mkdir -p /run/muster
            echo "$(basename "$entry")" > "/run/muster/pkey.$SLURM_JOB_ID"
            if [ -e /sys/class/net/ib0/create_child ] && [ ! -e "/sys/class/net/ib0.${want#0x}" ]; then
                echo "$want" > /sys/class/net/ib0/create_child
            fi
            exit 0
        fi
        index=$((index + 1))
    done
done
echo "P_Key $want of ${SLURM_JOB_ACCOUNT:-$SLURM_JOB_PARTITION} is not in this node's HCA table"
exit 1
