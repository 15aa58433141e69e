-- A worker says it is alive: its row is added or renewed, alive until $6
-- microseconds from now. $1 id, $2 host, $3 pid, $4 queues (JSON), $5
-- whether this is its first report (sets started_at).
INSERT INTO outbox_workers AS w (id, host, pid, queues, started_at, last_seen_at, expires_at)
VALUES ($1, $2, $3, $4::jsonb, now(), now(), now() + $6 * interval '1 microsecond')
ON CONFLICT (id) DO UPDATE SET
    queues = EXCLUDED.queues,
    started_at = CASE WHEN $5::boolean THEN now() ELSE w.started_at END,
    last_seen_at = now(),
    expires_at = EXCLUDED.expires_at
