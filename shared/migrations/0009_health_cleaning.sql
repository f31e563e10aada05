-- health: a node that re-registers while still running workers is CLEANING until the
-- launcher has stopped the stale ones (node.cleaned for that boot); clean_boot_id is
-- the boot it waits on ('' = nothing owed), so a restarted monitor keeps waiting.
ALTER TABLE nodes DROP CONSTRAINT nodes_state_known;
ALTER TABLE nodes ADD CONSTRAINT nodes_state_known CHECK (
    state IN ('UP', 'SUSPECT', 'CLEANING', 'DRAINING', 'DRAINED', 'DOWN', 'FAILED')
);
ALTER TABLE nodes ADD COLUMN clean_boot_id text NOT NULL DEFAULT '';
