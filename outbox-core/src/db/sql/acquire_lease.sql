-- Takes lease $1 for holder $2 for $3 microseconds when it is free or
-- expired, or renews it when $2 already holds it; returns the term (bumped
-- on every change of holder) and whether a leadership began (see
-- acquired_at) when $2 holds it afterwards, no row otherwise.
-- $4 (jsonb, may be null) is what the holder applies while it holds the
-- lease (migration 51), written with every renewal.
-- Expiry is judged by the database's clock only, so workers' clocks never
-- matter. Two candidates at once serialise on the row: the second sees the
-- first's fresh lease and gets no row.
INSERT INTO outbox_leases AS l (name, holder, expires_at, settings)
VALUES ($1, $2, now() + $3 * interval '1 microsecond', $4::jsonb)
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder,
    expires_at = excluded.expires_at,
    settings = excluded.settings,
    term = CASE WHEN l.holder = excluded.holder THEN l.term ELSE l.term + 1 END,
    -- A leadership begins when the lease is taken, and again when its
    -- holder takes it back after it ran out (another worker may have found
    -- it free meanwhile, and an operator's `periodic delete` judged by it).
    acquired_at = CASE WHEN l.holder = excluded.holder AND l.expires_at > now()
                       THEN l.acquired_at ELSE now() END
WHERE l.holder = excluded.holder OR l.expires_at <= now()
RETURNING term, acquired_at = now() AS began
