-- health: the monitor's node state machine (services/health/monitor_core.NodeHealth),
-- persisted so a restarted monitor rebuilds it from the tables (level-triggered).
ALTER TABLE nodes
    ADD COLUMN state_since    timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN recovery       text NOT NULL DEFAULT 'none',  -- none | reset | reboot
    ADD COLUMN fault_boot_id  text NOT NULL DEFAULT '',      -- boot that needed the reboot
    ADD COLUMN operator_drain boolean NOT NULL DEFAULT false,
    ADD COLUMN held           boolean NOT NULL DEFAULT false, -- flapped: operator resumes
    ADD COLUMN failures       double precision[] NOT NULL DEFAULT '{}', -- epoch seconds
    ADD COLUMN last_check     jsonb;                         -- the probe's last health check

ALTER TABLE gpus
    ADD COLUMN reset_pending boolean NOT NULL DEFAULT false;  -- row remap: reset at drain
