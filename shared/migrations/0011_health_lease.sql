-- health: replicas take turns judging liveness (one active monitor, fenced by an epoch;
-- shared/lease.py). Events are handled by any replica, under the nodes' row locks.
CREATE TABLE health_lease (
    id         int PRIMARY KEY CHECK (id = 1),
    holder     text NOT NULL,
    epoch      bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
