"""The consumer most teams write first, as a benchmark baseline (`make bench`'s (d)).

One Subscribe stream; for each receipt, one INSERT in autocommit (so one COMMIT) and then one
Ack of that receipt's token. It is honest, not sabotaged: it is idempotent (ON CONFLICT on
id + level, F8), acks only after the commit, and reuses one connection and one channel. What it
lacks is batching — which is the whole point of the comparison.

    python scripts/naive_consumer.py --gateway HOST:PORT --login L --password P \
        --database-url URL --count N
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time

import asyncpg
import grpc

from gateway.receipts.v1 import feed_pb2, feed_pb2_grpc

_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS naive;
CREATE TABLE IF NOT EXISTS naive.receipts (
    message_id     text        NOT NULL,
    level          integer     NOT NULL,
    stat           text        NOT NULL,
    delivery_count integer     NOT NULL,
    payload        bytea       NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, level)
)
"""

_INSERT = """
INSERT INTO naive.receipts (message_id, level, stat, delivery_count, payload)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (message_id, level) DO NOTHING
"""


async def consume(
    gateway: str, login: str, password: str, database_url: str, count: int
) -> dict[str, float]:
    """Consume `count` receipts one at a time; returns the receipts/s it achieved."""
    conn = await asyncpg.connect(database_url)
    await conn.execute(_SCHEMA)
    credentials = base64.b64encode(f"{login}:{password}".encode()).decode()
    metadata = (("authorization", f"Basic {credentials}"),)
    done = 0
    started = time.perf_counter()
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = feed_pb2_grpc.ReceiptFeedStub(channel)
        stream = stub.Subscribe(feed_pb2.SubscribeRequest(window=1000), metadata=metadata)
        async for receipt in stream:
            await conn.execute(
                _INSERT,
                receipt.id,
                receipt.level,
                receipt.stat,
                receipt.delivery_count,
                receipt.SerializeToString(),
            )
            await stub.Ack(feed_pb2.AckRequest(tokens=[receipt.ack_token]), metadata=metadata)
            done += 1
            if done >= count:
                stream.cancel()
                break
    elapsed = time.perf_counter() - started
    await conn.close()
    return {"receipts": done, "seconds": elapsed, "receipts_per_second": done / elapsed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--login", required=True)
    parser.add_argument("--password", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args(argv)
    result = asyncio.run(
        consume(args.gateway, args.login, args.password, args.database_url, args.count)
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
