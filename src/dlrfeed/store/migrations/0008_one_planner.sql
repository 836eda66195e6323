-- The rules as one planner (rules-2, docs/rules.md): what the planner needs stored, and what it
-- decides that the schema could not hold before.

-- P14/P19: each delivery's content fingerprint, so that late correlation and `dlrfeed
-- recompute` replay every delivery in its recorded arrival order (the reception id) with the
-- same key decisions as the live ingest. NULL on receptions stored before this migration: the
-- replay then derives it from the stored stat, err and done date.
ALTER TABLE dlr.receptions ADD COLUMN fingerprint text;
ALTER TABLE dlr.receptions DROP CONSTRAINT receptions_outcome_check;
ALTER TABLE dlr.receptions ADD CONSTRAINT receptions_outcome_check CHECK (outcome IN
    ('applied', 'repeat', 'late_progress', 'superseded', 'corroborated', 'conflict',
     'uncorrelated', 'unrecognized', 'unexpected_level'));

-- P14: the fingerprints of the further contents a key accepted after its first (level-1
-- progress updates; with deadline_unknown_superseded, a level-2 key's second result), in
-- arrival order. A delivery of any of them is a repeat.
ALTER TABLE dlr.events ADD COLUMN updates text[] NOT NULL DEFAULT '{}';

-- P7/P19: the basis the status rests on, held on the status row itself so that the planner
-- continues from it without reading the event: the delivery (a progress update is not its
-- event's first content), its level, stat and err, and its reported time when plausible (NULL
-- when absent or implausible: never used to order nor to measure latency). `flags`: the
-- status' own flags (arrival_order_tie, done_date_implausible).
ALTER TABLE dlr.message_status
    ADD COLUMN supporting_reception_id bigint,
    ADD COLUMN basis_level bigint,
    ADD COLUMN basis_stat text,
    ADD COLUMN basis_err text,
    ADD COLUMN basis_done_at timestamptz,
    ADD COLUMN flags text[] NOT NULL DEFAULT '{}';
-- Rows of rules-1 get their basis from the event that supported them; they stay stale
-- (rules_version) until `dlrfeed recompute` computes them again under the current rules. A
-- basis of a level other than 1 or 2 (rules-1 applied those) is held as rules-1 saw it, final
-- or not, so that the daemon continues from it until the recompute.
UPDATE dlr.message_status AS s
SET basis_level = CASE WHEN e.level IN (1, 2) THEN e.level WHEN s.is_final THEN 2 ELSE 1 END, basis_stat = e.stat, basis_err = e.err, basis_done_at = e.done_at,
    supporting_reception_id = (
        SELECT min(r.id) FROM dlr.receptions AS r
        WHERE r.login = e.login AND r.message_id = e.message_id AND r.event_id = e.id)
FROM dlr.events AS e
WHERE e.id = s.supporting_event_id;

-- P12: a second, different record of a sent message id is evidence of ambiguity.
ALTER TABLE dlr.exceptions DROP CONSTRAINT exceptions_kind_check;
ALTER TABLE dlr.exceptions ADD CONSTRAINT exceptions_kind_check CHECK (kind IN
    ('uncorrelated', 'conflict', 'unrecognized', 'unstorable', 'malformed', 'second_record'));

-- P8: `dlrfeed recompute`'s audit trail: one row per status it changed, before and after.
CREATE TABLE dlr.status_recomputations (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    login               text        NOT NULL,
    message_id          text        NOT NULL,
    old_status          text,
    old_is_final        boolean,
    old_reason          text,
    old_supporting_event_id bigint,
    old_rules_version   text,
    new_status          text,       -- NULL: no applicable receipt under the current rules
    new_is_final        boolean,
    new_reason          text,
    new_supporting_event_id bigint,
    new_rules_version   text        NOT NULL,
    why                 text        NOT NULL,
    recomputed_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX status_recomputations_message_idx
    ON dlr.status_recomputations (login, message_id);

DO $grants$
BEGIN
    REVOKE ALL ON dlr.status_recomputations FROM PUBLIC;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_writer') THEN
        -- P14: a key's accepted contents move with its counters.
        GRANT UPDATE (updates) ON dlr.events TO dlrfeed_writer;
        -- P19: late correlation replays a message's deliveries in their arrival order; it
        -- reads what the planner needs of them, never the payload (the evidence itself).
        GRANT SELECT (id, login, message_id, level, stat, err, done_date_raw, done_at,
                      received_at, fingerprint, flags, event_id)
              ON dlr.receptions TO dlrfeed_writer;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        GRANT SELECT ON dlr.status_recomputations TO dlrfeed_reader;
    END IF;
END
$grants$;
