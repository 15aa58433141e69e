-- Back to migration 43's fill: a tenth of each new page free.
ALTER TABLE outbox_tasks SET (fillfactor = 90);
