#!/bin/bash
# forker.sh [CHILDREN] [--stubborn]
#
# Forks CHILDREN (default 3) children, each of which forks a grandchild; all of them
# sleep. Cancelling the job must leave none of them alive: the launcher signals the
# job's whole process group. With --stubborn every process ignores SIGTERM, so only
# the SIGKILL that follows the grace period ends them.
children=${1:-3}
stubborn=${2:-}
if [ "$stubborn" = "--stubborn" ]; then
    trap '' TERM
fi
for _ in $(seq 1 "$children"); do
    (
        sleep 300 &
        echo "grandchild $!"
        wait
    ) &
    echo "child $!"
done
echo "forker $$ ready"
wait
