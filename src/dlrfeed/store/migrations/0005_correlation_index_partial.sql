-- P10: events are found by the id that correlates them to a sent message. That id is the
-- receipt's own id unless an integration option says otherwise (receipt_ids_hex), so the
-- unique index on (login, message_id, level) already finds nearly every event by it; a full
-- second index on (login, correlation_id) cost each event insert ~2.5 µs of the server's
-- ~17 (bench_store). It now holds only the events whose correlation id differs from their
-- id, and the lookups read both indexes (queries.INSERT_EVENTS_READ_STATUSES, WAITING_EVENTS).

-- Built under a new name before the old index is dropped, so reads of dlr.events wait only
-- for the drop, not for the build. Stop the daemons before migrating (docs/systemd.md): an
-- older dlrfeed's lookups cannot use the partial index and would scan the table.
CREATE INDEX events_login_correlation_id_differs_idx
    ON dlr.events (login, correlation_id)
    WHERE correlation_id <> message_id;

DROP INDEX dlr.events_login_correlation_id_idx;

ALTER INDEX dlr.events_login_correlation_id_differs_idx
    RENAME TO events_login_correlation_id_idx;
