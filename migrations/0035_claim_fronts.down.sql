DROP TABLE IF EXISTS outbox_claim_fronts;
