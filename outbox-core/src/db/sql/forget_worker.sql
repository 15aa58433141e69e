-- A worker leaving cleanly removes its row. $1 id.
DELETE FROM outbox_workers WHERE id = $1
