-- When a node left a live allocation: a shrink gave it back, or a spare replaced it.
-- Until now only `live = false` said so, with no moment, so what a node's GPUs were
-- held for could not be read back (the chaos audit guessed it from the job's last
-- generation, and the sizes report counted a dropped node to the allocation's end).
-- NULL while the node is in the allocation; a node taken back clears it.
ALTER TABLE allocation_nodes ADD COLUMN dropped_at timestamptz;
