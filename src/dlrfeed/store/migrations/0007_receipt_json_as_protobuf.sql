-- dlr.receipt_json refuses every byte string protobuf refuses (P9: the evidence view reads the
-- payload exactly as protobuf does). Two kinds of bytes read as a receipt although protobuf
-- refuses them:
--  * a string field with more than 256 NULs and invalid UTF-8 after the 256th: the rest of the
--    field went to bytea escape form (bounded work on hostile text) without being validated;
--  * a tag or a length written in more than 5 bytes: protobuf reads both as 32-bit varints,
--    at most 5 bytes long (values are read in up to 10).
-- Now every string field is validated whole before it is shown, in work linear in its length
-- however many NULs it holds, and tags and lengths longer than 5 bytes are refused. What
-- protobuf reads is shown as before.

-- The receipt in `payload` (a serialized gateway.receipts.v1.Receipt, interfaces §1) as JSON,
-- read as protobuf reads it: its fields by their proto names, absent optional fields absent,
-- `message_id` under `id`, the last occurrence of a field winning, numbers cut to uint32,
-- unknown fields, groups and fields of an unexpected wire type skipped. `ack_token` is left
-- out (a lease handle, not a fact about the message). Text holding NUL shows it as the six
-- characters \u0000, like the stored columns (docs/rules.md); past 256 NULs in one field, the
-- rest of that field in bytea escape form (\000; octal above 127). Bytes protobuf refuses give
-- {"undecodable": "<hex>"} instead of an error, so a query over many rows never fails on one.
-- PARALLEL UNSAFE: that fallback is an exception block, which parallel workers cannot run.
CREATE OR REPLACE FUNCTION dlr.receipt_json(payload bytea) RETURNS jsonb
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
    start integer;
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
        start := pos;
        SELECT v.value, v.next INTO tag, pos FROM dlr.wire_varint(payload, pos) AS v;
        IF tag >= 4294967296 OR pos - start > 5 THEN  -- protobuf: a tag is a 32-bit varint
            RAISE EXCEPTION 'tag beyond 32 bits at byte %', start;
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
            start := pos;
            SELECT v.value, v.next INTO number, pos FROM dlr.wire_varint(payload, pos) AS v;
            IF pos - start > 5 THEN  -- protobuf: a length is a 32-bit varint
                RAISE EXCEPTION 'length of field % beyond 32 bits at byte %', field, start;
            END IF;
            IF pos + number > size THEN
                RAISE EXCEPTION 'field % runs past the end', field;
            END IF;
            IF cardinality(groups) = 0 AND (field BETWEEN 1 AND 13 AND field <> 2 OR field = 100)
            THEN
                piece := substring(payload FROM pos + 1 FOR number::integer);
                IF position('\x00'::bytea IN piece) = 0 THEN
                    string := convert_from(piece, 'UTF8');  -- raises unless UTF-8
                ELSE
                    -- protobuf refuses the field unless all of it is UTF-8, and convert_from
                    -- refuses every NUL, so validate a copy whose NULs are other ASCII bytes
                    -- (an ASCII byte never takes part in a multi-byte character: validity is
                    -- the same). In hex, replacing each "00" by "01" does that in one pass:
                    -- a pair at a byte boundary turns 0x00 into 0x01, one straddling two bytes
                    -- (x0|0y) turns the second, 0x0y, into 0x1y; only bytes below 0x10 change,
                    -- each into another ASCII byte, and no NUL is left.
                    PERFORM convert_from(decode(replace(encode(piece, 'hex'), '00', '01'), 'hex'),
                                         'UTF8');  -- raises unless UTF-8
                    string := '';
                    nuls := 0;
                    LOOP  -- NUL is not storable in text: shown as \u0000 (six characters)
                        nul := position('\x00'::bytea IN piece);
                        EXIT WHEN nul = 0;
                        nuls := nuls + 1;
                        IF nuls > 256 THEN  -- each turn copies the rest: bounded work
                            piece := convert_to(encode(piece, 'escape'), 'UTF8');
                            EXIT;
                        END IF;
                        string := string || convert_from(substring(piece FOR nul - 1), 'UTF8')
                                  || '\u0000';
                        piece := substring(piece FROM nul + 1);
                    END LOOP;
                    string := string || convert_from(piece, 'UTF8');
                END IF;
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
