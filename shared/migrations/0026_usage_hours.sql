-- Usage by the hour (`muster report`, sreport's reports): every charge the fairshare
-- service makes is added to the hour its tick ends in, per user association, in the
-- transaction that adds it to `usage`. Raw GPU-seconds and billed GPU-seconds; never
-- decayed. A window's report sums whole hours, as sreport's hourly rollups do.
CREATE TABLE IF NOT EXISTS usage_hours (
    hour        timestamptz NOT NULL,
    account     text NOT NULL,
    user_name   text NOT NULL,
    gpu_seconds double precision NOT NULL DEFAULT 0,
    billed      double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, account, user_name)
);
