-- The next batch of one partition ($6 of $5) of a subscription of stream
-- $4, whose cursor is snapshot $1 and position $2: it has published
-- exactly the events visible in $1 with a position at most $2.
--
-- The batch cuts at this statement's own snapshot S2 and at a position H2
-- at most $3 past $2, and holds what S2 and H2 add: the events visible now
-- with a position in ($2, H2], and the events at or below $2 whose
-- transactions were still open at $1 (listed in it, or begun after it)
-- and have committed since. Every row returns S2 and H2, the cursor once
-- the batch is published; with no event, one row of them alone.
--
-- Order: an aggregate's emitters draw positions in their commit order, so
-- when an event is visible, every earlier event of its aggregate is too,
-- at a lower position: it is in this batch or an earlier one, never a
-- later one. Nothing here updates the log.
WITH cut AS MATERIALIZED (
    SELECT pg_current_snapshot() AS s2,
           greatest($2::bigint,
                    least($2::bigint + $3::bigint,
                          (SELECT CASE WHEN is_called THEN last_value ELSE 0 END
                           FROM outbox_event_position_seq))) AS h2
)
SELECT cut.s2::text AS s2, cut.h2, e.position, e.id::text AS id,
       e.aggregatetype::text AS aggregatetype, e.aggregateid::text AS aggregateid,
       e.type::text AS type, e.payload, e.headers, e.publish_at, e.created_at,
       e.aggregate_hash
FROM cut
LEFT JOIN LATERAL (
    SELECT * FROM outbox_event_log
    WHERE position > $2 AND position <= cut.h2
    UNION ALL
    -- (position + 0: these two are found by transaction id, never by
    -- scanning every position up to the cursor's.)
    SELECT * FROM outbox_event_log
    WHERE position + 0 <= $2 AND xid = ANY (ARRAY(SELECT pg_snapshot_xip($1::pg_snapshot)))
    UNION ALL
    SELECT * FROM outbox_event_log
    WHERE position + 0 <= $2 AND xid >= pg_snapshot_xmax($1::pg_snapshot)
      AND xid < pg_snapshot_xmax(cut.s2)
) AS e ON e.stream = $4 AND (e.aggregate_hash & 2147483647) % $5 = $6
ORDER BY e.position
