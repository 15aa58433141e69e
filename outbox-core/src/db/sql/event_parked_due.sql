-- The held-back events of partition $3 (of $2) of subscription $1 whose
-- aggregate is due to be tried again (its first event's retry_at has
-- come), in order, at most $4, of at most $4 aggregates. `alone`: the
-- aggregate holds back that one event only.
--
-- Only an aggregate's first held-back event carries a time (migration
-- 37), so the due ones are found through the due index, any $4 of them:
-- none is left behind, as each look publishes what it finds and the next
-- one follows at once after a whole batch. Each is read with its
-- aggregate's events in one lateral read by the aggregate's index, which
-- also tells whether it is still the first (one behind that still has a
-- time, left by a relay of an earlier migration, is passed over) and
-- whether it is alone. Lateral reads, not joins: without statistics (a
-- new table), a join the planner chose scanned the whole list for each
-- aggregate, 17 s for 600 events.
WITH due AS MATERIALIZED (
    SELECT p.position, p.aggregatetype, p.aggregateid
    FROM outbox_event_parked AS p
    WHERE p.subscription = $1 AND p.retry_at <= now()
      AND (p.aggregate_hash & 2147483647) % $2 = $3
    LIMIT $4
)
SELECT e.position, e.id::text AS id, e.aggregatetype::text AS aggregatetype,
       e.aggregateid::text AS aggregateid, e.type::text AS type,
       e.payload::text AS payload, e.headers,
       e.publish_at, e.created_at, e.aggregate_hash, e.held = 1 AS alone
FROM due AS d
CROSS JOIN LATERAL (
    SELECT a.*, min(a.position) OVER () AS first, count(*) OVER () AS held
    FROM (SELECT * FROM outbox_event_parked AS p
          WHERE p.subscription = $1 AND p.aggregatetype = d.aggregatetype
            AND p.aggregateid = d.aggregateid
          ORDER BY p.position
          LIMIT $4) AS a) AS e
WHERE e.first = d.position
ORDER BY e.position
LIMIT $4
