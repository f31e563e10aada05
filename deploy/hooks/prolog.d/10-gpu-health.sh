#!/bin/sh
# GPU health check before a job: every GPU the job was given answers nvidia-smi, has
# no pending retired pages / row remap failure, and runs no other process. Skipped
# where the node has no nvidia-smi (a simulated node).
set -eu
command -v nvidia-smi >/dev/null 2>&1 || exit 0
[ -n "${CUDA_VISIBLE_DEVICES:-}" ] || exit 0
for gpu in $(echo "$CUDA_VISIBLE_DEVICES" | tr ',' ' '); do
    if ! nvidia-smi -i "$gpu" --query-gpu=index --format=csv,noheader >/dev/null 2>&1; then
        echo "GPU $gpu does not answer nvidia-smi"; exit 1
    fi
    remap=$(nvidia-smi -i "$gpu" --query-remapped-rows=remapped_rows.failure \
        --format=csv,noheader 2>/dev/null || echo "")
    case "$remap" in *Yes*|*yes*) echo "GPU $gpu: row remapping failed"; exit 1 ;; esac
    busy=$(nvidia-smi -i "$gpu" --query-compute-apps=pid --format=csv,noheader 2>/dev/null | wc -l)
    if [ "$busy" -ne 0 ]; then echo "GPU $gpu still runs $busy process(es)"; exit 1; fi
done
