-- For a latency phase that timed out: the positions of the events $1 (ids)
-- that were not acknowledged, those of them held back (parked), and each
-- cursor's position and gaps.
SELECT format('missing at positions %s; held back %s; cursors %s',
              (SELECT coalesce(array_agg(position ORDER BY position)::text, 'none')
               FROM outbox_event_log WHERE id = ANY ($1::uuid[])),
              (SELECT coalesce(array_agg(format('%s (retry at %s: %s)', position, retry_at,
                                                error) ORDER BY position)::text, 'none')
               FROM outbox_event_parked WHERE id = ANY ($1::uuid[])),
              (SELECT string_agg(format('%s/%s at %s, gaps %s (bounds %s), lease until %s',
                                        subscription, part, position, gaps, gap_bounds,
                                        lease_until), '; ')
               FROM outbox_event_cursors))
