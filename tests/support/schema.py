"""The schema `dlr` of a database, described as sorted lines to compare with a checked-in file.

Tests that a migration builds exactly the expected schema (tests/integration/
test_migrations_schema.txt) share this one description.
"""

import asyncpg

DESCRIBE = {
    "column": """
        SELECT table_name || '.' || column_name || ' ' || data_type
               || CASE WHEN is_nullable = 'NO' THEN ' not null' ELSE '' END
               || coalesce(' default ' || column_default, '')
               || CASE WHEN is_identity = 'YES' THEN ' identity ' || identity_generation ELSE '' END
        FROM information_schema.columns WHERE table_schema = 'dlr'""",
    "constraint": """
        SELECT conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = 'dlr'::regnamespace""",
    "index": "SELECT indexdef FROM pg_indexes WHERE schemaname = 'dlr'",
    "trigger": """
        SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'dlr'::regnamespace AND NOT t.tgisinternal""",
    "function": """
        SELECT p.proname || ' ' || md5(pg_get_functiondef(p.oid)) FROM pg_proc p
        WHERE p.pronamespace = 'dlr'::regnamespace""",
    "storage": """
        SELECT relname || ' ' || array_to_string(reloptions, ',') FROM pg_class
        WHERE relnamespace = 'dlr'::regnamespace AND reloptions IS NOT NULL""",
    "view": """
        SELECT viewname || ' ' || md5(definition) FROM pg_views WHERE schemaname = 'dlr'""",
    "sequence": """
        SELECT sequence_name || ' increment ' || increment
        FROM information_schema.sequences WHERE sequence_schema = 'dlr'""",
}


async def describe(dsn: str) -> str:
    """The schema `dlr` as sorted lines: columns, constraints, indexes, triggers, functions (their
    whole definitions: body, security, settings)."""
    conn = await asyncpg.connect(dsn)
    try:
        lines: list[str] = []
        for kind, query in DESCRIBE.items():
            lines += sorted(f"{kind} {row[0]}" for row in await conn.fetch(query))
    finally:
        await conn.close()
    return "\n".join(lines) + "\n"
