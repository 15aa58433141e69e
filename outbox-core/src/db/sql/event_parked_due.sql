-- The held-back events of partition $3 (of $2) of subscription $1 whose
-- aggregate is due to be tried again (its first event's retry_at has
-- come), in order, at most $4, of at most $4 aggregates; with each, how
-- many of its aggregate's held-back events the read found (`held`): when
-- the rows returned for an aggregate are fewer, it holds back more than
-- the look read; and the version of its row the look read (`seen`, its
-- `xmin`, for the unpark to tell an operator's retry made since).
--
-- Only an aggregate's first held-back event carries a time (migration
-- 37), so the due ones are found through the due index, any $4 of them:
-- none is left behind, as each look publishes what it finds and the next
-- one follows at once when it left some. Each is read with its
-- aggregate's events in one lateral read by the aggregate's index, which
-- also tells whether it is still the first (one behind that still has a
-- time, left by a relay of an earlier migration, is passed over). An
-- aggregate's read stops at its share of the batch (and one more, to
-- tell whether there is more), so that many due aggregates with long
-- lines behind them cost a look about a batch, not all of their lines.
-- Lateral reads, not joins: without statistics (a new table), a join the
-- planner chose scanned the whole list for each aggregate, 17 s for 600
-- events.
WITH due AS MATERIALIZED (
    SELECT p.position, p.aggregatetype, p.aggregateid
    FROM outbox_event_parked AS p
    WHERE p.subscription = $1 AND p.retry_at <= now()
      AND (p.aggregate_hash & 2147483647) % $2 = $3
    LIMIT $4
), share AS (
    SELECT greatest(1, $4 / greatest(count(*), 1)) AS events FROM due
)
SELECT e.position, e.id::text AS id, e.aggregatetype::text AS aggregatetype,
       e.aggregateid::text AS aggregateid, e.type::text AS type,
       e.payload::text AS payload, e.headers,
       e.publish_at, e.created_at, e.aggregate_hash, e.held, e.seen
FROM due AS d
CROSS JOIN LATERAL (
    SELECT a.*, min(a.position) OVER () AS first, count(*) OVER () AS held,
           row_number() OVER (ORDER BY a.position) AS nth
    FROM (SELECT p.*, p.xmin::text AS seen FROM outbox_event_parked AS p
          WHERE p.subscription = $1 AND p.aggregatetype = d.aggregatetype
            AND p.aggregateid = d.aggregateid
          ORDER BY p.position
          LIMIT (SELECT events + 1 FROM share)) AS a) AS e
WHERE e.first = d.position AND e.nth <= (SELECT events FROM share)
ORDER BY e.position
LIMIT $4
