-- The GPUs a running step holds alone, by node ({"node01": [0, 1]}), as Slurm's steps
-- are exclusive: a step started beside it with --gpus-per-task gets others, or waits
-- (services/launcher/steps_core.py). Empty for a step that holds none (--overlap, or
-- no --gpus-per-task). Read only from the job's RUNNING steps, under its row lock.
ALTER TABLE job_steps ADD COLUMN gpus jsonb NOT NULL DEFAULT '{}'::jsonb;
