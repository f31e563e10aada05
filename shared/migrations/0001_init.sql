-- Muster schema. Each table names its one writing service.

-- plumbing (every service) ---------------------------------------------------------
CREATE TABLE outbox (
    id           bigserial PRIMARY KEY,
    event_id     uuid NOT NULL UNIQUE,
    subject      text NOT NULL,
    payload      bytea NOT NULL,
    headers      jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;

CREATE TABLE inbox (
    consumer   text NOT NULL,
    event_id   uuid NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- admission -------------------------------------------------------------------------
CREATE TABLE jobs (
    job_id              bigserial PRIMARY KEY,
    name                text NOT NULL,
    user_name           text NOT NULL,
    account             text NOT NULL,
    partition           text NOT NULL,
    qos                 text NOT NULL,
    nodes_min           int NOT NULL CHECK (nodes_min >= 1),
    nodes_max           int NOT NULL CHECK (nodes_max >= nodes_min),
    gpus_per_node       int NOT NULL CHECK (gpus_per_node >= 0),
    time_limit_s        int NOT NULL CHECK (time_limit_s > 0),
    spec                jsonb NOT NULL,
    submitted_at        timestamptz NOT NULL DEFAULT now(),
    held                boolean NOT NULL DEFAULT false,
    hold_reason         text,
    cancel_requested_at timestamptz,
    cancel_reason       text,
    array_job_id        bigint,
    array_task_id       int
);
CREATE INDEX jobs_user ON jobs (user_name);
CREATE INDEX jobs_live ON jobs (job_id) WHERE cancel_requested_at IS NULL;

-- health ----------------------------------------------------------------------------
CREATE TABLE nodes (
    name           text PRIMARY KEY,
    address        text NOT NULL DEFAULT '127.0.0.1',
    state          text NOT NULL DEFAULT 'UP',
    reason         text NOT NULL DEFAULT '',
    topology       text[] NOT NULL DEFAULT '{}',
    boot_id        text NOT NULL DEFAULT '',
    last_heartbeat timestamptz,
    last_fault     jsonb,
    fault_count    int NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE gpus (
    node       text NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    idx        int NOT NULL,
    uuid       text NOT NULL DEFAULT '',
    pci        text NOT NULL DEFAULT '',
    model      text NOT NULL,
    memory_mib int NOT NULL DEFAULT 0,
    locality   int NOT NULL DEFAULT 0,
    healthy    boolean NOT NULL DEFAULT true,
    last_xid   int,
    PRIMARY KEY (node, idx)
);

-- placer ----------------------------------------------------------------------------
CREATE TABLE placer_lease (
    id         int PRIMARY KEY CHECK (id = 1),
    holder     text NOT NULL,
    epoch      bigint NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE TABLE allocations (
    alloc_id       bigserial PRIMARY KEY,
    job_id         bigint NOT NULL REFERENCES jobs (job_id),
    attempt        int NOT NULL,
    epoch          bigint NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    released_at    timestamptz,
    release_reason text,
    UNIQUE (job_id, attempt)
);
CREATE UNIQUE INDEX one_live_allocation_per_job ON allocations (job_id) WHERE released_at IS NULL;

CREATE TABLE allocation_nodes (
    alloc_id bigint NOT NULL REFERENCES allocations (alloc_id),
    node     text NOT NULL,
    rank     int NOT NULL,
    gpus     int[] NOT NULL,
    live     boolean NOT NULL DEFAULT true,
    PRIMARY KEY (alloc_id, node)
);

-- Invariant 1, last line of defence: no GPU is held by two live allocations.
CREATE TABLE allocation_gpus (
    alloc_id bigint NOT NULL REFERENCES allocations (alloc_id),
    node     text NOT NULL,
    gpu      int NOT NULL,
    live     boolean NOT NULL DEFAULT true,
    PRIMARY KEY (alloc_id, node, gpu)
);
CREATE UNIQUE INDEX one_live_holder_per_gpu ON allocation_gpus (node, gpu) WHERE live;

-- Invariant 5: a deposed placer's writes are refused by the database.
CREATE FUNCTION placer_fence() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    current_epoch bigint;
BEGIN
    SELECT epoch INTO current_epoch FROM placer_lease WHERE id = 1;
    IF current_epoch IS NULL OR NEW.epoch <> current_epoch THEN
        RAISE EXCEPTION 'placer epoch % is fenced off (current epoch %)', NEW.epoch, current_epoch
            USING ERRCODE = 'P0001';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER allocations_fenced BEFORE INSERT ON allocations
    FOR EACH ROW EXECUTE FUNCTION placer_fence();

CREATE TABLE pending_reasons (
    job_id          bigint PRIMARY KEY,
    reason          text NOT NULL,
    detail          text NOT NULL DEFAULT '',
    estimated_start timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE placer_cycles (
    epoch      bigint NOT NULL,
    cycle      bigint NOT NULL,
    started_at timestamptz NOT NULL,
    duration_s double precision NOT NULL,
    placed     int NOT NULL,
    pending    int NOT NULL,
    PRIMARY KEY (epoch, cycle)
);

-- launcher --------------------------------------------------------------------------
CREATE TABLE job_runs (
    job_id         bigint PRIMARY KEY REFERENCES jobs (job_id),
    state          text NOT NULL,
    reason         text NOT NULL DEFAULT '',
    attempt        int NOT NULL DEFAULT 0,
    restart_count  int NOT NULL DEFAULT 0,
    excluded_nodes text[] NOT NULL DEFAULT '{}',
    nodes          text[] NOT NULL DEFAULT '{}',
    gpus           jsonb NOT NULL DEFAULT '[]',
    world_size     int NOT NULL DEFAULT 0,
    exit_code      int,
    signal         int,
    started_at     timestamptz,
    ended_at       timestamptz,
    gpu_seconds    double precision NOT NULL DEFAULT 0,  -- closed segments
    segment_start  timestamptz,                          -- the running segment
    segment_gpus   int NOT NULL DEFAULT 0,
    stopping_to    text,                                 -- COMPLETING: the state it ends in
    stopping_since timestamptz,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE worker_exits (
    job_id     bigint NOT NULL,
    attempt    int NOT NULL,
    generation int NOT NULL,
    node       text NOT NULL,
    exit_code  int,
    signal     int,
    oom_killed boolean NOT NULL DEFAULT false,
    at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, attempt, generation, node)
);

CREATE TABLE attempts (
    job_id     bigint NOT NULL REFERENCES jobs (job_id),
    attempt    int NOT NULL,
    seq        int NOT NULL,
    nodes      text[] NOT NULL,
    world_size int NOT NULL,
    reason     text NOT NULL,
    outcome    text,
    started_at timestamptz NOT NULL DEFAULT now(),
    ended_at   timestamptz,
    PRIMARY KEY (job_id, attempt, seq)
);

-- fairshare -------------------------------------------------------------------------
CREATE TABLE usage (
    user_name   text NOT NULL,
    account     text NOT NULL,
    gpu_seconds double precision NOT NULL DEFAULT 0,
    decayed     double precision NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_name, account)
);

CREATE TABLE usage_charges (
    job_id      bigint NOT NULL,
    attempt     int NOT NULL,
    user_name   text NOT NULL,
    account     text NOT NULL,
    charged     double precision NOT NULL DEFAULT 0,
    settled     boolean NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, attempt)
);
