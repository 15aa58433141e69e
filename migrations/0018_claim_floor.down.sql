DROP FUNCTION outbox_claim_tasks(text, bigint, text, timestamptz, smallint, timestamptz, bigint,
                                 timestamptz, bigint);
