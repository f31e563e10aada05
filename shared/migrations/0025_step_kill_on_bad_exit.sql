-- srun -K (--kill-on-bad-exit): when one task of the step exits non-zero, the step's
-- other tasks, on every node, are ended (services/launcher/steps.py). Kept with the
-- step so a replica that adopts it (its coordinator died) ends them too.
ALTER TABLE job_steps ADD COLUMN kill_on_bad_exit boolean NOT NULL DEFAULT false;
