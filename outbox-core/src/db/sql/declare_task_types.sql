-- A worker declares the task types registered in its binary, for
-- outbox_submit (migration 0014). $1: a JSON array of objects with the
-- columns below, sorted by task type (so two workers starting together lock
-- the rows in one order). A row that says the same is left alone.
INSERT INTO outbox_task_types AS d (task_type, queue, priority, max_attempts, skip_dead,
                                    unique_fields, unique_period_us, unique_states, ordering_field,
                                    keys_from_payload)
SELECT t.task_type, t.queue, t.priority, t.max_attempts, t.skip_dead,
       CASE WHEN t.unique_fields IS NOT NULL
            THEN ARRAY(SELECT jsonb_array_elements_text(t.unique_fields)) END,
       t.unique_period_us, t.unique_states, t.ordering_field, t.keys_from_payload
FROM jsonb_to_recordset($1::jsonb) AS t(task_type text, queue text, priority smallint,
                                        max_attempts int, skip_dead boolean, unique_fields jsonb,
                                        unique_period_us bigint, unique_states smallint,
                                        ordering_field text, keys_from_payload boolean)
ORDER BY t.task_type
ON CONFLICT (task_type) DO UPDATE SET
    queue = EXCLUDED.queue,
    priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts,
    skip_dead = EXCLUDED.skip_dead,
    unique_fields = EXCLUDED.unique_fields,
    unique_period_us = EXCLUDED.unique_period_us,
    unique_states = EXCLUDED.unique_states,
    ordering_field = EXCLUDED.ordering_field,
    keys_from_payload = EXCLUDED.keys_from_payload,
    registered_at = now()
WHERE (d.queue, d.priority, d.max_attempts, d.skip_dead, d.unique_fields, d.unique_period_us,
       d.unique_states, d.ordering_field, d.keys_from_payload)
      IS DISTINCT FROM
      (EXCLUDED.queue, EXCLUDED.priority, EXCLUDED.max_attempts, EXCLUDED.skip_dead,
       EXCLUDED.unique_fields, EXCLUDED.unique_period_us, EXCLUDED.unique_states,
       EXCLUDED.ordering_field, EXCLUDED.keys_from_payload)
