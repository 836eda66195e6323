-- Receipts by both paths a gateway offers: its feed, and the HTTP callback a message sent with a
-- `dlr_url` gets instead (`dlrfeed webhook`, docs/webhook.md). Both go through the same ingest
-- into the same tables, so each reception says which path it came by, and a callback says who
-- posted it. The same receipt by feed and by callback is one logical event (P14): the channel
-- is evidence, never part of the key.
--
-- Adding a column with a constant default to a partitioned table rewrites nothing (the default
-- is kept in the catalog for the rows already there), so this runs in moments on a store of
-- any size, under a brief ACCESS EXCLUSIVE lock on dlr.receptions and its partitions.

CREATE TYPE dlr.reception_channel AS ENUM ('feed', 'webhook');
COMMENT ON TYPE dlr.reception_channel IS
    'how a reception reached dlrfeed: the gateway''s gRPC feed, or an HTTP callback (dlr_url)';

ALTER TABLE dlr.receptions
    ADD COLUMN channel dlr.reception_channel NOT NULL DEFAULT 'feed',
    ADD COLUMN peer text;
COMMENT ON COLUMN dlr.receptions.channel IS
    'feed: payload is the serialized gateway.receipts.v1.Receipt; webhook: payload is the'
    ' callback as posted (its body, or the query string of a GET)';
COMMENT ON COLUMN dlr.receptions.peer IS
    'the address (host:port) an HTTP callback came from; NULL for the feed';

-- A callback's payload as JSON: the body itself when it is a JSON object (the gateway's own
-- webhook), otherwise the text as posted under "form" (Jasmin's and Kannel's form and query
-- encodings; docs/webhook-formats.md), and {"undecodable": "<hex>"} for bytes that are not
-- UTF-8, so a query over many rows never fails on one.
-- PARALLEL UNSAFE: the fallback is an exception block, which parallel workers cannot run.
CREATE FUNCTION dlr.callback_json(payload bytea) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL UNSAFE AS $fn$
DECLARE
    body text;
    parsed jsonb;
BEGIN
    BEGIN
        body := convert_from(payload, 'UTF8');
    EXCEPTION WHEN OTHERS THEN
        RETURN jsonb_build_object('undecodable', encode(payload, 'hex'));
    END;
    BEGIN
        parsed := body::jsonb;
    EXCEPTION WHEN OTHERS THEN
        RETURN jsonb_build_object('form', body);
    END;
    IF jsonb_typeof(parsed) = 'object' THEN
        RETURN parsed;
    END IF;
    RETURN jsonb_build_object('form', body);
END;
$fn$;
COMMENT ON FUNCTION dlr.callback_json(bytea) IS
    'an HTTP callback''s payload as JSON: the posted object, {"form": text}, or {"undecodable": hex}';

-- `r.*` is expanded when the view is created (0003): recreated to show the new columns, and
-- to read each payload the way its channel wrote it.
DROP VIEW dlr.receptions_readable;
CREATE VIEW dlr.receptions_readable AS
SELECT r.*,
       CASE r.channel
           WHEN 'webhook' THEN dlr.callback_json(r.payload)
           ELSE dlr.receipt_json(r.payload)
       END AS payload_json
FROM dlr.receptions AS r;
COMMENT ON VIEW dlr.receptions_readable IS
    'dlr.receptions with payload_json: the receipt in payload, as JSON (dlr.receipt_json for'
    ' the feed, dlr.callback_json for a callback)';

REVOKE ALL ON dlr.receptions_readable FROM PUBLIC;
DO $grants$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        GRANT SELECT ON dlr.receptions_readable TO dlrfeed_reader;
    END IF;
END
$grants$;
