-- Every subscription with how far behind it is: its slowest partition's
-- position, the events of its stream past it (counted up to a million)
-- and those at a partition's gaps at or below it, how long the oldest of
-- them has waited, its live relay workers, what it
-- has published, how long its relay's publishes have failed and why,
-- and the events it holds back (with the aggregates held
-- back by a refused event, which wait for an operator, apart from those
-- waiting for a delay to run out); with the log's head, the
-- sequence's cache and increment, and its furthest partition's position,
-- for what would stop its relay (head_problem in event_log.rs).
WITH head AS (
    -- Under the sequence's lock (see event_last_position.sql).
    SELECT coalesce(pg_sequence_last_value(q.seqrelid), 0) AS position,
           q.seqcache AS cache, q.seqincrement AS increment
    FROM pg_sequence AS q
    WHERE q.seqrelid = 'outbox_event_position_seq'::regclass
), subs AS (
    SELECT s.name, s.stream, s.partitions, min(c.position) AS position,
           max(c.position) AS furthest,
           count(DISTINCT c.holder) FILTER (WHERE c.lease_until > now()) AS holders,
           sum(c.published)::bigint AS published,
           max(c.advanced_at) AS advanced_at,
           s.created_at
    FROM outbox_event_subscriptions AS s
    JOIN outbox_event_cursors AS c ON c.subscription = s.name
    GROUP BY s.name
), gapped AS (
    -- Events a cursor passed while their transactions were open, committed
    -- since and not published yet (a broker down, say): each counted
    -- against the partition of its aggregate (another partition's cursor
    -- forgets it at its next read).
    SELECT c.subscription, min(e.created_at) AS oldest, count(*) AS events
    FROM outbox_event_cursors AS c
    JOIN outbox_event_subscriptions AS s ON s.name = c.subscription
    JOIN outbox_event_log AS e ON e.position = ANY (c.gaps)
    WHERE e.stream = s.stream
      AND (hashtext(e.aggregatetype::text || '/' || e.aggregateid::text) & 2147483647)
          % s.partitions = c.part
      AND e.position <= (SELECT p.position FROM subs AS p WHERE p.name = c.subscription)
    GROUP BY c.subscription
), failing AS (
    -- The live relay worker whose publishes have failed the longest, with
    -- its last reason (migration 39).
    SELECT DISTINCT ON (m.subscription) m.subscription, m.failing_since, m.failing_why
    FROM outbox_event_members AS m
    WHERE m.seen_until > now() AND m.failing_since IS NOT NULL
    ORDER BY m.subscription, m.failing_since
)
SELECT s.name, s.stream, s.partitions, s.position,
       (SELECT count(*) FROM (SELECT 1 FROM outbox_event_log AS e
                              WHERE e.position > s.position AND e.stream = s.stream
                              LIMIT 1000000) AS behind) + coalesce(g.events, 0) AS behind,
       coalesce(extract(epoch FROM now() - least(
           (SELECT e.created_at FROM outbox_event_log AS e
            WHERE e.position > s.position AND e.stream = s.stream
            ORDER BY e.position LIMIT 1),
           g.oldest)), 0)::float8 AS lag_s,
       s.holders, s.published, h.parked, h.parked_aggregates, h.refused_aggregates,
       (SELECT position FROM head) AS head,
       (SELECT cache FROM head) AS sequence_cache,
       (SELECT increment FROM head) AS sequence_increment,
       s.furthest,
       extract(epoch FROM now() - f.failing_since)::float8 AS failing_s, f.failing_why
FROM subs AS s
LEFT JOIN gapped AS g ON g.subscription = s.name
LEFT JOIN failing AS f ON f.subscription = s.name
-- The held-back events, read once for the three counts. Only an
-- aggregate's first held-back event has a time or an error (migration
-- 37): the aggregates are counted by their first events, with no sort (a
-- million events held back took 0.9 s to count by distinct aggregate, at
-- every scrape of the metrics, and take 0.11 s so).
CROSS JOIN LATERAL (
    SELECT count(*) AS parked,
           count(*) FILTER (WHERE p.retry_at IS NOT NULL OR p.error IS NOT NULL)
               AS parked_aggregates,
           count(*) FILTER (WHERE p.error IS NOT NULL) AS refused_aggregates
    FROM outbox_event_parked AS p
    WHERE p.subscription = s.name) AS h
ORDER BY s.name
