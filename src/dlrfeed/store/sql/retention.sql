-- Retention by whole days (dlrfeed.store.retention, `dlrfeed maintain`). The day partitions
-- live in schema dlr_partitions; a partition's name is only known at run time, so it is
-- written {partition} and quoted as an identifier by Query.naming.

-- name: set_lock_timeout
-- DDL on a partition needs a moment of ACCESS EXCLUSIVE on its parent: wait at most
-- :lock_timeout for the ingest transactions in flight, so that the daemon's next batches queue
-- behind us only that long. Local to the transaction it guards (is_local true): through a
-- transaction pooler a session setting would stay on a server connection another client gets
-- next, or be missing from the one this transaction runs on.
SELECT set_config('lock_timeout', :lock_timeout, true)

-- name: create_reception_partitions
-- The partitions of dlr.receptions for every day before :through (migration 0010); returns
-- the names of the ones created.
SELECT dlr.create_reception_partitions(:through) AS name

-- name: create_status_change_partitions
-- The partitions of dlr.status_changes for every day before :through (migration 0011).
SELECT dlr.create_status_change_partitions(:through) AS name

-- name: partitions_to_drop
-- The day partitions of :parent_table whose whole day ended before :cutoff, oldest first.
SELECT partition_name, lower_bound, upper_bound
FROM dlr.day_partitions
WHERE parent_table = :parent_table AND NOT is_default AND upper_bound <= :cutoff
ORDER BY upper_bound

-- name: table_columns
-- The columns of :table_name in order, for an archive's manifest.
SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type
FROM pg_attribute AS a
WHERE a.attrelid = :table_name::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum

-- name: lock_change_cursors
-- No durable consumer may start (at 0) while a day of changes is checked and dropped.
LOCK TABLE dlr.change_cursors IN SHARE MODE

-- name: unread_by
-- The consumer furthest behind that has not read every change of a partition (its cursor lies
-- below the partition's last position): dropping the day would take changes it never saw.
-- Run after lock_change_cursors, so no cursor appears meanwhile.
SELECT c.consumer, c.position
FROM dlr.change_cursors AS c
WHERE c.position < (SELECT max(position) FROM dlr_partitions.{partition})
  AND c.consumer <> ALL(:abandoned::text[])
ORDER BY c.position, c.consumer
LIMIT 1

-- name: drop_partition
-- A day of evidence or of changes goes as one DROP, never row by row (P13).
DROP TABLE dlr_partitions.{partition}

-- name: count_partition
-- The rows of a partition about to be archived.
SELECT count(*) FROM dlr_partitions.{partition}

-- name: partition_holds_rows
-- Whether a (default) partition holds any row: a day had no partition when its rows came.
SELECT EXISTS (SELECT 1 FROM dlr_partitions.{partition})
