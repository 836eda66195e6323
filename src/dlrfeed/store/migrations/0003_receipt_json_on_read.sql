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

-- One varint of the protobuf wire format at byte `pos` (0-based): its value and the position
-- after it. Raises on a varint that runs past the end or beyond 64 bits.
CREATE FUNCTION dlr.wire_varint(payload bytea, pos integer, OUT value numeric, OUT next integer)
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    byte integer;
    shift integer := 0;
BEGIN
    value := 0;
    next := pos;
    LOOP
        IF shift > 63 THEN
            RAISE EXCEPTION 'varint longer than 64 bits at byte %', pos;
        END IF;
        byte := get_byte(payload, next);  -- raises past the end
        next := next + 1;
        value := value + (byte & 127) * (2::numeric ^ shift);
        EXIT WHEN byte < 128;
        shift := shift + 7;
    END LOOP;
END;
$fn$;

-- The receipt in `payload` (a serialized gateway.receipts.v1.Receipt, CONTRACT §1) as JSON:
-- its fields by their proto names, absent optional fields absent, `message_id` under `id`;
-- `ack_token` left out (a lease handle, not a fact about the message). Text holding NUL shows
-- it as the six characters \u0000, like the stored columns (docs/rules.md); past 256 NULs in
-- one field, the rest of that field in bytea escape form (\000; octal above 127). Bytes that
-- are not a receipt give {"undecodable": "<hex>"} instead of an error, so a query over many
-- rows never fails on one.
CREATE FUNCTION dlr.receipt_json(payload bytea) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
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
    field numeric;
    wire integer;
    number numeric;
    piece bytea;
    nul integer;
    nuls integer;
    string text;
BEGIN
    WHILE pos < size LOOP
        SELECT v.value, v.next INTO tag, pos FROM dlr.wire_varint(payload, pos) AS v;
        field := div(tag, 8);
        wire := mod(tag, 8)::integer;
        IF (field IN (2, 101) AND wire <> 0)
           OR ((field BETWEEN 1 AND 13 AND field <> 2 OR field = 100) AND wire <> 2) THEN
            RAISE EXCEPTION 'field % with wire type %', field, wire;
        END IF;
        IF wire = 0 THEN
            SELECT v.value, v.next INTO number, pos FROM dlr.wire_varint(payload, pos) AS v;
            IF field = 2 THEN
                result := result || jsonb_build_object('level', number);
            ELSIF field = 101 THEN
                result := result || jsonb_build_object('delivery_count', number);
            END IF;
        ELSIF wire = 2 THEN
            SELECT v.value, v.next INTO number, pos FROM dlr.wire_varint(payload, pos) AS v;
            IF pos + number > size THEN
                RAISE EXCEPTION 'field % runs past the end', field;
            END IF;
            IF field BETWEEN 1 AND 13 AND field <> 2 OR field = 100 THEN
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
                    result := result || jsonb_build_object(names[field::integer], string);
                END IF;
            END IF;
            pos := pos + number::integer;
        ELSIF wire = 1 THEN
            pos := pos + 8;  -- fields unknown to this schema are skipped, as protobuf does
        ELSIF wire = 5 THEN
            pos := pos + 4;
        ELSE
            RAISE EXCEPTION 'wire type % at byte %', wire, pos;
        END IF;
    END LOOP;
    IF pos > size THEN
        RAISE EXCEPTION 'truncated';
    END IF;
    RETURN result;
EXCEPTION WHEN OTHERS THEN
    RETURN jsonb_build_object('undecodable', encode(payload, 'hex'));
END;
$fn$;

ALTER TABLE dlr.receptions DROP COLUMN payload_json;

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
