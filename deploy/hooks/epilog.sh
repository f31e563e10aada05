#!/bin/sh
# Muster Epilog (MUSTER_EPILOG=/etc/muster/hooks/epilog.sh): runs as root on each node
# after the job's last process there has gone (its cgroup is already removed), whether
# it completed, failed, was cancelled or preempted. A failure drains the node.
set -eu
here=$(dirname "$0")
status=0
for hook in "$here"/epilog.d/*; do
    [ -x "$hook" ] || continue
    "$hook" || { echo "$(basename "$hook") failed"; status=1; }
done
exit $status
