-- The JSON form of a reception is derived from its evidence when read, no longer stored.
--
-- Until now every reception held the receipt twice: `payload` (the serialized bytes, whole,
-- P9) and `payload_json` (the same fields as jsonb, for humans). The copy made each row ~40 %
-- bigger and cost every delivery a JSON encode in the daemon and a jsonb parse in the server
-- (~12 of ~75 µs per receipt through Store.ingest; docs/benchmarks.md). `dlr.receipt_json`
-- now reads the same form out of the bytes, so it can never disagree with the evidence, and
-- the view `dlr.receptions_readable` is the table with that column added back:
--
--     SELECT received_at, payload_json->>'text' FROM dlr.receptions_readable WHERE ...

-- One varint of the protobuf wire format at byte `pos` (0-based): its value (the low 64 bits,
-- as protobuf keeps them) and the position after it. Raises past the end or beyond 10 bytes.
CREATE FUNCTION dlr.wire_varint(payload bytea, pos integer, OUT value numeric, OUT next integer)
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    byte integer;
    scale numeric := 1;
BEGIN
    value := 0;
    next := pos;
    LOOP
        IF next - pos >= 10 THEN
            RAISE EXCEPTION 'varint longer than 10 bytes at byte %', pos;
        END IF;
        byte := get_byte(payload, next);  -- raises past the end
        next := next + 1;
        value := value + (byte & 127) * scale;
        EXIT WHEN byte < 128;
        scale := scale * 128;
    END LOOP;
    value := mod(value, 18446744073709551616);
END;
$fn$;

-- The receipt in `payload` (a serialized gateway.receipts.v1.Receipt, interfaces §1) as JSON,
-- read as protobuf reads it: its fields by their proto names, absent optional fields absent,
-- `message_id` under `id`, the last occurrence of a field winning, numbers cut to uint32,
-- unknown fields, groups and fields of an unexpected wire type skipped. `ack_token` is left
-- out (a lease handle, not a fact about the message). Text holding NUL shows it as the six
-- characters \u0000, like the stored columns (docs/rules.md); past 256 NULs in one field, the
-- rest of that field in bytea escape form (\000; octal above 127). Bytes protobuf refuses give
-- {"undecodable": "<hex>"} instead of an error, so a query over many rows never fails on one.
-- PARALLEL UNSAFE: that fallback is an exception block, which parallel workers cannot run.
CREATE FUNCTION dlr.receipt_json(payload bytea) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL UNSAFE AS $fn$
DECLARE
    -- Field numbers 1-13 of Receipt; 2 (level) is the one number among them.
    names CONSTANT text[] := ARRAY[
        'id', 'level', 'stat', 'err', 'sub', 'dlvrd', 'submit_date', 'done_date', 'text',
        'source_addr', 'destination_addr', 'smsc_message_id', 'connector'];
    -- proto3 leaves zero values off the wire: the non-optional fields start at their zero.
    result jsonb := '{"id": "", "level": 0, "stat": "", "delivery_count": 0}';
    size CONSTANT integer := length(payload);
    pos integer := 0;
    tag numeric;
    field bigint;
    wire integer;
    number numeric;
    groups bigint[] := '{}';  -- the groups we are inside (their numbers): skipped whole
    piece bytea;
    nul integer;
    nuls integer;
    string text;
BEGIN
    WHILE pos < size LOOP
        SELECT v.value, v.next INTO tag, pos FROM dlr.wire_varint(payload, pos) AS v;
        IF tag >= 4294967296 THEN
            RAISE EXCEPTION 'tag beyond 32 bits at byte %', pos;
        END IF;
        field := div(tag, 8);
        wire := mod(tag, 8)::integer;
        IF field = 0 THEN
            RAISE EXCEPTION 'field number 0 at byte %', pos;
        END IF;
        IF wire = 3 THEN  -- start of a group: nothing of Receipt, skipped to its end
            IF cardinality(groups) >= 100 THEN  -- protobuf's recursion limit
                RAISE EXCEPTION 'groups nested too deep at byte %', pos;
            END IF;
            groups := groups || field;
        ELSIF wire = 4 THEN
            IF cardinality(groups) = 0 OR groups[cardinality(groups)] <> field THEN
                RAISE EXCEPTION 'end of a group never started at byte %', pos;
            END IF;
            groups := groups[1:cardinality(groups) - 1];
        ELSIF wire = 0 THEN
            SELECT v.value, v.next INTO number, pos FROM dlr.wire_varint(payload, pos) AS v;
            IF cardinality(groups) = 0 AND field IN (2, 101) THEN
                result := result || jsonb_build_object(
                    CASE field WHEN 2 THEN 'level' ELSE 'delivery_count' END,
                    mod(number, 4294967296)::bigint);
            END IF;
        ELSIF wire = 2 THEN
            SELECT v.value, v.next INTO number, pos FROM dlr.wire_varint(payload, pos) AS v;
            IF pos + number > size THEN
                RAISE EXCEPTION 'field % runs past the end', field;
            END IF;
            IF cardinality(groups) = 0 AND (field BETWEEN 1 AND 13 AND field <> 2 OR field = 100)
            THEN
                piece := substring(payload FROM pos + 1 FOR number::integer);
                string := '';
                nuls := 0;
                LOOP  -- NUL is not storable in text: shown as \u0000 (six characters)
                    nul := position('\x00'::bytea IN piece);
                    EXIT WHEN nul = 0;
                    nuls := nuls + 1;
                    IF nuls > 256 THEN  -- each turn copies the rest: bounded work on hostile text
                        piece := convert_to(encode(piece, 'escape'), 'UTF8');
                        EXIT;
                    END IF;
                    string := string || convert_from(substring(piece FOR nul - 1), 'UTF8')
                              || '\u0000';
                    piece := substring(piece FROM nul + 1);
                END LOOP;
                string := string || convert_from(piece, 'UTF8');  -- raises unless UTF-8
                IF field <> 100 THEN  -- the token is read (it must be UTF-8), not shown
                    result := result || jsonb_build_object(names[field], string);
                END IF;
            END IF;
            pos := pos + number::integer;
        ELSIF wire IN (1, 5) THEN  -- fixed64 / fixed32: nothing of Receipt, skipped
            pos := pos + CASE wire WHEN 1 THEN 8 ELSE 4 END;
            IF pos > size THEN
                RAISE EXCEPTION 'field % runs past the end', field;
            END IF;
        ELSE
            RAISE EXCEPTION 'wire type % at byte %', wire, pos;
        END IF;
    END LOOP;
    IF cardinality(groups) > 0 THEN
        RAISE EXCEPTION 'a group never ends';
    END IF;
    RETURN result;
EXCEPTION WHEN OTHERS THEN
    RETURN jsonb_build_object('undecodable', encode(payload, 'hex'));
END;
$fn$;

ALTER TABLE dlr.receptions DROP COLUMN payload_json;

-- `r.*` is expanded when the view is created: a migration that adds a column to dlr.receptions
-- recreates this view (and grants on it again, as below).
CREATE VIEW dlr.receptions_readable AS
SELECT r.*, dlr.receipt_json(r.payload) AS payload_json
FROM dlr.receptions AS r;
COMMENT ON VIEW dlr.receptions_readable IS
    'dlr.receptions with payload_json: the receipt in payload, as JSON (dlr.receipt_json)';

-- Privileges as in 0002_roles.sql: readers read it, PUBLIC nothing.
REVOKE ALL ON dlr.receptions_readable FROM PUBLIC;
DO $grants$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        GRANT SELECT ON dlr.receptions_readable TO dlrfeed_reader;
    END IF;
END
$grants$;
