DROP FUNCTION outbox_emit(text, text, text, jsonb, jsonb, jsonb);
DROP FUNCTION outbox_new_event_id();
DROP FUNCTION outbox_submit(text, jsonb, jsonb);
DROP FUNCTION outbox_field_text(text, jsonb, text, text);
DROP FUNCTION outbox_option_text(text, jsonb, text);
DROP FUNCTION outbox_check_options(text, jsonb, text[]);
DROP FUNCTION outbox_json_delay(text, jsonb, interval);
DROP FUNCTION outbox_refuse(text);
DROP TABLE outbox_task_types;
