-- A relay's looks at what it holds back read only the aggregates due
-- again, through an index, instead of every held-back event of the
-- subscription (200,000 delayed events took 0.4 s of the database's time
-- a look, and a relay looks every second).
--
-- From here only an aggregate's first held-back event carries a
-- `retry_at`: the events behind it have none until they are first
-- (the relay's unpark, an operator's skip and the relay's sweep give the
-- new first its time). A first event with neither a time nor an error
-- cannot be left by these; the sweep gives one, if a race left it, a
-- time of now.
UPDATE outbox_event_parked AS p SET retry_at = NULL
WHERE p.retry_at IS NOT NULL
  AND EXISTS (SELECT 1 FROM outbox_event_parked AS q
              WHERE q.subscription = p.subscription AND q.aggregatetype = p.aggregatetype
                AND q.aggregateid = p.aggregateid AND q.position < p.position);

CREATE INDEX outbox_event_parked_due_idx
    ON outbox_event_parked (subscription, retry_at) WHERE retry_at IS NOT NULL;
