-- outbox: what operator views need without counting the task table.

-- Outcomes per minute, queue and worker, as each worker counted them in
-- memory and added here every few seconds. The dashboard's hourly chart
-- and its per-queue throughput read this small table instead of counting
-- completed rows (which may be millions, or deleted at once with
-- retention 0). A worker writes only its own rows, so workers never wait
-- on each other's locks. Maintenance deletes rows older than a day.
CREATE TABLE outbox_throughput (
    minute    timestamptz NOT NULL,
    queue     text NOT NULL,
    worker    text NOT NULL,
    completed bigint NOT NULL DEFAULT 0,
    -- Failed attempts, dead tasks included.
    failed    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, queue, worker)
);

-- Dead tasks by queue: the overview counts them per queue with an
-- index-only scan (dead rows rarely change, so they are all-visible).
CREATE INDEX outbox_tasks_dead_queue_idx
    ON outbox_tasks (queue)
    WHERE dead_at IS NOT NULL;
