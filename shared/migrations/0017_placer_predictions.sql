-- placer: when a running job is expected to end, from its runtime prediction (extended
-- once outlived, never past its limit; services/placer/core/predict.py), and why: which
-- history the figure comes from. `muster show job` shows it beside the limit. NULL: no
-- prediction (too little history, or predictions off); the job is planned on its limit.
ALTER TABLE allocations
    ADD COLUMN predicted_end timestamptz,
    ADD COLUMN predicted_why text NOT NULL DEFAULT '';
