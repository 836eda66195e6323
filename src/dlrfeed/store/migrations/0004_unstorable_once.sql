-- C8: a poison receipt delivered again is one open investigation, not one per delivery.
--
-- A receipt the database refuses is kept as an `unstorable` exception with its raw bytes and
-- acked. If that ack is lost, the gateway delivers the receipt again (F6) with another
-- ack_token and delivery_count, and each delivery used to open its own exception: the same
-- problem counted twice in the investigation queue. `evidence_key` is the same for every
-- delivery of one receipt (the SHA-256 of its bytes without those two fields,
-- dlrfeed.domain.wire_format.evidence_key); at most one open `unstorable` exception holds a
-- key. A redelivery still keeps its own bytes as evidence, in a row opened already resolved
-- with a pointer to the open one.

ALTER TABLE dlr.exceptions ADD COLUMN evidence_key text;

CREATE UNIQUE INDEX exceptions_open_unstorable_key
    ON dlr.exceptions (login, evidence_key)
    WHERE kind = 'unstorable' AND resolved_at IS NULL;
