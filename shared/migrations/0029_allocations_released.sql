-- The job-size report (`muster report --sizes`, services/fairshare/sizes_report.py) reads
-- the allocations that lived in its window: those released after its start, or live.
-- By this index a report of yesterday reads yesterday's allocations, not a year's.
CREATE INDEX allocations_released ON allocations (released_at);
