-- Where the last slow walk of each queue's claimable index found its first
-- task (issue 23, item 4; worker/claim_floor.rs).
--
-- Beside a snapshot held open for minutes, the claimable index keeps the
-- entry of every task claimed since, and a claim that reads it from its
-- front steps over all of them: a second or more after five minutes. A
-- running producer does that only once in a while (its floor, migration
-- 18), but a producer that has just started had no floor, so its first
-- claim walked the whole index: a worker restarted beside such a snapshot
-- lost that time at every start, and so did each of the bench's drains
-- (0.5 s of a 2 s drain after two minutes).
--
-- A producer whose walk was slow writes where it found its first task
-- here; a producer starting within that walk's floor age begins there, and
-- walks the whole index when the walk that wrote the row falls due, as the
-- producer that wrote it would. The row is a hint: nothing else reads it,
-- a missing or old one means a walk, and it is written in a statement of
-- its own, never by a claim (claims of a queue would otherwise queue on
-- its row).
CREATE TABLE outbox_claim_fronts (
    queue text PRIMARY KEY,
    -- The first task the walk found, in the claim order.
    priority smallint NOT NULL,
    execute_at timestamptz NOT NULL,
    id bigint NOT NULL,
    -- How long the walk took.
    walk_ms double precision NOT NULL,
    walked_at timestamptz NOT NULL
);
