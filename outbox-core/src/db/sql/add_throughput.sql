-- Adds a worker's outcome counts to the per-minute table: $1 minutes, $2
-- queues, $3 completed, $4 failed (parallel arrays), $5 the worker id. Only
-- this worker's rows are touched, so workers never wait on each other.
INSERT INTO outbox_throughput AS t (minute, queue, worker, completed, failed)
SELECT minute, queue, $5, completed, failed
FROM unnest($1::timestamptz[], $2::text[], $3::bigint[], $4::bigint[])
     AS c(minute, queue, completed, failed)
ON CONFLICT (minute, queue, worker) DO UPDATE
SET completed = t.completed + excluded.completed,
    failed = t.failed + excluded.failed
