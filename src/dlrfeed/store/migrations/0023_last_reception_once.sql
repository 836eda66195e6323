-- An event's last reception time is kept only when it is not its first (docs/scaling.md,
-- "Where the bytes go").
--
-- Most logical events are delivered once, and each wrote the time of that delivery twice:
-- first_received_at and last_received_at (8 bytes each). From now on an event inserted holds
-- last_received_at NULL, and a later delivery sets it; a reader takes
-- coalesce(last_received_at, first_received_at). An event stored before keeps both.
-- Lock: ACCESS EXCLUSIVE on dlr.events for a dropped NOT NULL (a catalog change, held for
-- milliseconds whatever the table's size), to the commit.

SET LOCAL lock_timeout = '5s';

ALTER TABLE dlr.events ALTER COLUMN last_received_at DROP NOT NULL;
COMMENT ON COLUMN dlr.events.last_received_at IS
    'when the latest delivery of the event was received; NULL: only its first was'
    ' (first_received_at, migration 0023)';
