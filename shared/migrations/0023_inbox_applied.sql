-- The inbox is trimmed by age (shared/retention.py): rows applied longer ago than the
-- stream can redeliver their event are removed, a bounded batch at a time from the
-- oldest. This index is where that batch is read from, so a pass reads what it
-- removes, not the whole inbox.
CREATE INDEX inbox_applied ON inbox (applied_at);
