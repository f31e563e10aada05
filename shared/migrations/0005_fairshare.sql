-- fairshare: charging state for the pure core, decay bookkeeping, job priorities.
-- Written only by the fairshare service (the placer reads job_priorities).

-- One row per attempt (the pure core's AttemptCharge): billed usage and the GPU model
-- remembered from the first tick that named it, so a settlement is billed alike.
ALTER TABLE usage_charges
    ADD COLUMN billed    double precision NOT NULL DEFAULT 0,
    ADD COLUMN gpu_model text,
    ADD COLUMN last_at   double precision NOT NULL DEFAULT 0;

-- usage.gpu_seconds: raw GPU-seconds charged; usage.billed: billed, never decayed;
-- usage.decayed: billed and decayed as of fairshare_state.decayed_at.
ALTER TABLE usage ADD COLUMN billed double precision NOT NULL DEFAULT 0;

-- When usage was last decayed and last reset; one row, locked by whoever decays.
CREATE TABLE fairshare_state (
    id         int PRIMARY KEY CHECK (id = 1),
    decayed_at timestamptz NOT NULL DEFAULT now(),
    last_reset timestamptz
);
INSERT INTO fairshare_state(id) VALUES (1);

-- Multifactor priority of every pending job: `total` orders the placer's queue,
-- `factors` is the breakdown (as sprio shows it) for `muster show job`.
CREATE TABLE job_priorities (
    job_id     bigint PRIMARY KEY,
    total      double precision NOT NULL,
    factors    jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
