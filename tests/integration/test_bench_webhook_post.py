"""The callback benchmark's poster (wrk with `webhook_post.lua`) against a real HTTP server on
loopback: every body posted exactly once, nothing else sent, and the latencies it reports are
those of the posts alone, even while the last answers are slow to come."""

from __future__ import annotations

import asyncio
import shutil
from collections import Counter
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler

from dlrfeed_tools.bench.webhook import _post_all
from dlrfeed_tools.pgcluster import free_port

ANSWER_S = 0.02  # every post is answered after this long
LAST_ANSWER_S = 0.5  # the last body's answer, far later: the other connections have none left


async def test_every_body_is_posted_once_and_only_the_posts_are_timed(tmp_path: Path) -> None:
    assert shutil.which("wrk"), (
        "wrk missing: run `make install` (scripts/ensure-system-packages.sh)"
    )
    bodies = [f'{{"id": "m{n}", "level": 2, "stat": "DELIVRD"}}'.encode() for n in range(200)]
    bodies_file = tmp_path / "bodies"
    bodies_file.write_bytes(b"\n".join(bodies) + b"\n")
    seen: list[tuple[str, str, bytes]] = []

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        seen.append((request.method, request.path, await request.read()))
        return await handler(request)

    async def answer(request: web.Request) -> web.Response:
        body = await request.read()
        await asyncio.sleep(LAST_ANSWER_S if body == bodies[-1] else ANSWER_S)
        return web.json_response({"outcome": "applied"})

    app = web.Application(middlewares=[record])
    app.router.add_post("/dlr", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        posted, cpu = await asyncio.to_thread(_post_all, port, bodies_file, 8)
    finally:
        await runner.cleanup()
    assert (posted["answered"], posted["failed"]) == (len(bodies), 0)
    assert Counter(seen) == Counter(("POST", "/dlr", body) for body in bodies), "nothing else"
    assert posted["p50_ms"] >= 1000 * ANSWER_S, posted
    assert posted["seconds"] >= LAST_ANSWER_S
    assert cpu > 0
