-- P10: events are found by the id that correlates them to a sent message. That id is the
-- receipt's own id unless an integration option says otherwise (receipt_ids_hex), so the
-- unique index on (login, message_id, level) already finds nearly every event by it; a full
-- second index on (login, correlation_id) cost each event insert ~2.5 µs of the server's
-- ~17 (bench_store). It now holds only the events whose correlation id differs from their
-- id, and the lookups read both indexes (queries.INSERT_EVENTS_READ_STATUSES, WAITING_EVENTS).

DROP INDEX dlr.events_login_correlation_id_idx;

CREATE INDEX events_login_correlation_id_idx
    ON dlr.events (login, correlation_id)
    WHERE correlation_id <> message_id;
