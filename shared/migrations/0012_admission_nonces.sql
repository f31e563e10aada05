-- Admission: the nonces of signed requests that changed something, shared by every
-- admission replica, so a request replayed to another replica within the clock-skew
-- window is refused too (each replica's in-memory cache catches its own). A row is
-- useless once `forget_at` is past: the timestamp check refuses the replay by itself.
CREATE TABLE api_nonces (
    nonce     text PRIMARY KEY,  -- "<public key>:<nonce>"
    forget_at timestamptz NOT NULL
);
CREATE INDEX api_nonces_forget_at ON api_nonces (forget_at);
