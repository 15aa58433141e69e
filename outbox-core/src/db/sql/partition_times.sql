-- The times partitions (the history's, the event log's) must cover: now ($3 clock override)
-- and every $2 microseconds (a partition's width) up to $1 microseconds
-- ahead, furthest first: a partition ahead has no rows to take over from
-- the default partition, so it can always be made, even when the current
-- one cannot be yet.
SELECT t
FROM generate_series(coalesce($3::timestamptz, now()),
                     coalesce($3::timestamptz, now()) + $1 * interval '1 microsecond',
                     $2 * interval '1 microsecond') AS t
ORDER BY t DESC
