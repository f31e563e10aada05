-- launcher: the nodes that re-registered and are still owed a `node.cleaned` (the
-- workers they reported, whose attempt has ended, stopped first). A row is kept until
-- the answer is in the outbox, so an agent that cannot be reached is retried by the
-- periodic reconcile, and a restarted launcher still answers.
CREATE TABLE node_cleanings (
    node        text PRIMARY KEY,
    boot_id     text NOT NULL,
    reported    jsonb NOT NULL,  -- [{job_id, attempt, generation}] as node.registered said
    received_at timestamptz NOT NULL DEFAULT now(),
    tries       int NOT NULL DEFAULT 0
);
