-- states: one spelling of every state (shared/states.py), so a typo fails at the write
-- instead of becoming a state no service handles. tests/service/test_states.py checks
-- that these lists and the enums agree.
ALTER TABLE nodes ADD CONSTRAINT nodes_state_known CHECK (
    state IN ('UP', 'SUSPECT', 'DRAINING', 'DRAINED', 'DOWN', 'FAILED')
);

-- A run row holds the launcher's states; PENDING and CONFIGURING are derived, never stored.
ALTER TABLE job_runs ADD CONSTRAINT job_runs_state_known CHECK (
    state IN ('STARTING', 'RUNNING', 'COMPLETING', 'REQUEUED',
              'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL',
              'OUT_OF_MEMORY', 'PREEMPTED')
);

-- COMPLETING ends in a terminal state or back in the queue.
ALTER TABLE job_runs ADD CONSTRAINT job_runs_stopping_to_known CHECK (
    stopping_to IS NULL OR stopping_to IN ('REQUEUED',
              'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL',
              'OUT_OF_MEMORY', 'PREEMPTED')
);
