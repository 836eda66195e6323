"""Jasmin's DLR thrower as a program: a receipt callback made exactly as Jasmin makes it.

Jasmin (jookies/jasmin 0.11, `jasmin/routing/throwers.py`, `DLRThrower.http_dlr_callback`)
calls a message's `dlr-url` with treq on Twisted — the versions Jasmin pins — and this program
makes the same call: `HTTPClient(Agent(reactor)).request(method, url, params=args` for a GET,
`data=args` for a POST`, timeout=http_timeout, headers=...)`, with Jasmin's headers, the same
arguments (`id`, `level`, `message_status`, `connector`; at level 2 also `id_smsc`, `sub`,
`dlvrd`, `subdate`, `donedate`, `err`, `text`). A callback is done only when the answer is not
an HTTP error and its body, stripped, is `ACK/Jasmin`; anything else (an error status, another
body, a refused connection, a timeout) is thrown again `retry_delay` seconds later, up to
`max_retries` more times (Jasmin's `[dlr-thrower]` settings; Jasmin's own exemption of a 404
compares the text `404` with `"404: HttpApiError (...)"`, so it never applies).

    python tests/support/jasmin_thrower.py URL GET|POST [--retry-delay S] [--max-retries N]

reads one JSON object per line on stdin (one callback's arguments), throws them one after the
other, and prints one JSON line per attempt: {"id", "attempt", "code", "body", "acked",
"error"}. Twisted runs here, in its own process, so no test shares a reactor.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from treq import text_content
from treq.client import HTTPClient
from twisted.internet import defer, task
from twisted.web.client import Agent

ACK = "ACK/Jasmin"
# As throwers.py sends them, for a GET too; "DLRThrower" is its service's name.
HEADERS = {
    "Content-Type": "application/x-www-form-urlencoded",
    "Accept": "text/plain",
    "User-Agent": "Jasmin gateway/1.0 DLRThrower",
}


async def _throw(client: Any, options: argparse.Namespace, args: dict[str, Any]) -> tuple[int, str]:
    params, data = (args, None) if options.method == "GET" else (None, args)
    response = await client.request(
        options.method,
        options.url,
        params=params,
        data=data,
        timeout=options.http_timeout,
        headers=HEADERS,
    )
    body = await text_content(response)
    return int(response.code), str(body)


async def _run(reactor: Any, options: argparse.Namespace, callbacks: list[dict[str, Any]]) -> None:
    client = HTTPClient(Agent(reactor))  # type: ignore[no-untyped-call]  # Twisted's, untyped
    for args in callbacks:
        for attempt in range(1, options.max_retries + 2):
            line: dict[str, Any] = {"id": args["id"], "attempt": attempt}
            try:
                code, body = await _throw(client, options, args)
            except Exception as exc:  # noqa: BLE001  # Jasmin retries whatever failed
                line.update(code=None, body=None, acked=False, error=repr(exc))
            else:
                acked = code < 400 and body.strip() == ACK
                line.update(code=code, body=body, acked=acked, error=None)
            print(json.dumps(line), flush=True)
            if line["acked"]:
                break
            await task.deferLater(reactor, options.retry_delay, lambda: None)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("method", choices=["GET", "POST"])
    parser.add_argument("--retry-delay", type=float, default=30.0)
    parser.add_argument("--max-retries", type=int, default=3)
    parser.add_argument("--http-timeout", type=float, default=30.0)
    options = parser.parse_args()
    callbacks = [json.loads(line) for line in sys.stdin if line.strip()]
    # react() runs the reactor until the Deferred fires: exit 0, or 1 with its traceback.
    task.react(lambda reactor: defer.ensureDeferred(_run(reactor, options, callbacks)))


if __name__ == "__main__":
    main()
