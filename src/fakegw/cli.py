"""`fakegw`: serve the fake gateway, and feed or inspect one (docs/spec/interfaces.md §2)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import grpc
import structlog

from fakegw.admin_client import SyncAdminClient
from fakegw.callbacks import CallbackSettings
from fakegw.faults import Faults
from fakegw.server import FakeGateway
from fakegw.traffic import TrafficMix, scenario

_CHUNK = 5000  # receipts per admin call when reading a file


def _login_pair(text: str) -> tuple[str, str]:
    name, sep, password = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME:PASSWORD, got {text!r}")
    return name, password


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _login_file(text: str) -> tuple[str, str]:
    name, sep, path = text.partition(":")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME:FILE, got {text!r}")
    return name, path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fakegw", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the fake gateway")
    serve.add_argument("--listen", type=_host_port, default=("127.0.0.1", 50051))
    serve.add_argument("--login", type=_login_pair, action="append", required=True)
    serve.add_argument("--store", default=":memory:", help="SQLite file (WAL) or :memory:")
    serve.add_argument(
        "--shared-store",
        action="store_true",
        help="SQLite is the authority: several fakegw processes on one --store act as one gateway",
    )
    serve.add_argument("--lease-seconds", type=float, default=120.0)
    serve.add_argument("--max-window", type=int, default=1000)
    serve.add_argument("--cap", type=int, default=1_000_000)
    serve.add_argument("--retention-seconds", type=float, default=604_800.0)
    serve.add_argument("--dlr-deadline-seconds", type=float, default=86_400.0)
    serve.add_argument("--max-pull-wait-seconds", type=float, default=20.0)
    serve.add_argument("--housekeeping-seconds", type=float, default=None)
    serve.add_argument("--tls-cert", help="PEM server certificate chain: serve TLS")
    serve.add_argument("--tls-key", help="PEM server private key (with --tls-cert)")
    serve.add_argument("--tls-client-ca", help="PEM CA that client certificates must chain to")
    serve.add_argument(
        "--ledger-max-records", type=int, default=0, help="keep only the newest N (0 = all)"
    )
    serve.add_argument(
        "--no-uvloop", action="store_true", help="use the stock asyncio loop instead of uvloop"
    )
    callbacks = serve.add_argument_group(
        "callbacks (F2: receipts of a message with a dlr_url are POSTed there, never queued)"
    )
    callbacks.add_argument(
        "--callback-timeout-seconds", type=float, default=10.0, help="per POST (default 10)"
    )
    callbacks.add_argument(
        "--callback-attempts",
        type=int,
        default=10,
        help="POSTs of one callback in all before it is given up (default 10)",
    )
    callbacks.add_argument(
        "--callback-backoff-seconds",
        type=float,
        default=1.0,
        help="wait after the first failed POST, doubling after each, with jitter (default 1)",
    )
    callbacks.add_argument(
        "--callback-max-backoff-seconds",
        type=float,
        default=60.0,
        help="cap of the backoff and of a receiver's Retry-After (default 60)",
    )
    callbacks.add_argument(
        "--callback-concurrency", type=int, default=32, help="POSTs in flight at once (default 32)"
    )
    callbacks.add_argument(
        "--callback-bearer-file",
        metavar="FILE",
        help="send 'Authorization: Bearer <the file's first line>' with every callback",
    )
    callbacks.add_argument(
        "--callback-login-bearer-file",
        type=_login_file,
        action="append",
        default=[],
        metavar="NAME:FILE",
        help="the bearer token for one login's callbacks (repeatable; wins over the above)",
    )
    faults = serve.add_argument_group("faults (seedable: same seed + same calls = same run)")
    faults.add_argument("--seed", type=int, default=0)
    faults.add_argument("--duplicate-rate", type=float, default=0.0)
    faults.add_argument("--cut-stream-every", type=int, default=0)
    faults.add_argument("--unavailable-rate", type=float, default=0.0)
    faults.add_argument("--ack-lost-rate", type=float, default=0.0)
    faults.add_argument("--latency-ms", type=float, default=0.0)
    faults.add_argument("--no-subscribe", action="store_true")
    faults.add_argument(
        "--callback-duplicate-rate",
        type=float,
        default=0.0,
        help="probability that a delivered callback is POSTed once more (a lost answer)",
    )

    for name, help_text in (
        (
            "inject",
            "enqueue receipts given as JSON lines (webhook bodies); "
            "a line with a dlr_url is POSTed there instead",
        ),
        ("send", "register sent messages given as JSON lines (F2/F3 simulation)"),
        ("report", "network receipts for sent messages, JSON lines; F2 filters them"),
        ("stats", "print one JSON object of queue counters"),
        ("faults", "print (and with --set K=V, change) the fault knobs"),
        ("traffic", "send seeded messages and inject their receipts, with content faults"),
    ):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--target", required=True)
        sub.add_argument("--login", required=True)
        sub.add_argument(
            "--password",
            default=os.environ.get("FAKEGW_PASSWORD"),
            help="or env FAKEGW_PASSWORD; without one, the login is named (loopback only)",
        )
        if name in ("inject", "send", "report"):
            sub.add_argument("file", help="JSON lines file, or - for stdin")
        if name == "faults":
            sub.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE")
        if name == "traffic":
            sub.add_argument("--messages", type=int, default=1000, help="total messages")
            sub.add_argument("--rate", type=float, default=0.0, help="messages/s (0 = at once)")
            sub.add_argument("--seed", type=int, default=0)
            sub.add_argument("--submissions-out", help="write dlrfeed record-submissions lines")
            sub.add_argument(
                "--verifications-out",
                help="write dlrfeed record-verifications lines: the messages that really "
                "arrived, of which --verify-rate had their code entered",
            )
            sub.add_argument(
                "--verify-rate",
                type=float,
                default=0.85,
                help="the share of the messages really delivered whose code is entered",
            )
            for knob in (
                "progress-rate",
                "duplicate-rate",
                "result-before-progress-rate",
                "conflicting-final-rate",
                "unknown-id-rate",
                "malformed-rate",
                "lying-route-rate",  # fake DELIVRDs at submit time (fakegw.traffic.LYING_ROUTE)
            ):
                sub.add_argument(f"--{knob}", type=float, default=0.8 if knob[0] == "p" else 0.0)
    return parser


def _json_lines(stream: TextIO) -> Iterator[dict[str, Any]]:
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        value = json.loads(line)
        if not isinstance(value, dict):
            raise SystemExit(f"line {number}: expected a JSON object")
        yield value


def _chunks(items: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= _CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@contextlib.contextmanager
def _open_input(path: str) -> Iterator[TextIO]:
    if path == "-":
        yield sys.stdin
    else:
        with open(path, encoding="utf-8") as stream:
            yield stream


def _server_credentials(args: argparse.Namespace) -> grpc.ServerCredentials | None:
    """TLS from --tls-cert/--tls-key; mTLS when --tls-client-ca is given; None = plaintext."""
    if not args.tls_cert:
        return None
    pair = [(Path(args.tls_key).read_bytes(), Path(args.tls_cert).read_bytes())]
    client_ca = Path(args.tls_client_ca).read_bytes() if args.tls_client_ca else None
    return grpc.ssl_server_credentials(
        pair, root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _bearer_token(path: str) -> str:
    """The token in a file: its first line, without the line break."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if not lines or not lines[0].strip():
        raise SystemExit(f"no bearer token in {path}")
    return lines[0].strip()


def _callback_settings(args: argparse.Namespace) -> CallbackSettings:
    try:
        return CallbackSettings(
            timeout_seconds=args.callback_timeout_seconds,
            attempts=args.callback_attempts,
            backoff_seconds=args.callback_backoff_seconds,
            max_backoff_seconds=args.callback_max_backoff_seconds,
            concurrency=args.callback_concurrency,
            bearer_token=_bearer_token(args.callback_bearer_file)
            if args.callback_bearer_file
            else None,
            login_bearer_tokens={
                name: _bearer_token(path) for name, path in args.callback_login_bearer_file
            },
        )
    except ValueError as exc:
        raise SystemExit(f"fakegw serve: {exc}") from exc


def _log_to_stderr() -> None:
    """JSON log lines on stderr: stdout carries only the `listening` line scripts read."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
    )


async def _serve(args: argparse.Namespace) -> int:
    host, port = args.listen
    credentials = _server_credentials(args)
    _log_to_stderr()
    gateway = FakeGateway(
        dict(args.login),
        store=args.store,
        shared_store=args.shared_store,
        lease_seconds=args.lease_seconds,
        max_window=args.max_window,
        cap=args.cap,
        retention_seconds=args.retention_seconds,
        dlr_deadline_seconds=args.dlr_deadline_seconds,
        housekeeping_seconds=args.housekeeping_seconds,
        max_pull_wait_seconds=args.max_pull_wait_seconds,
        ledger_max_records=args.ledger_max_records,
        server_credentials=credentials,
        faults=Faults(
            seed=args.seed,
            duplicate_rate=args.duplicate_rate,
            cut_stream_every=args.cut_stream_every,
            unavailable_rate=args.unavailable_rate,
            ack_lost_rate=args.ack_lost_rate,
            latency_ms=args.latency_ms,
            no_subscribe=args.no_subscribe,
            callback_duplicate_rate=args.callback_duplicate_rate,
        ),
        callbacks=_callback_settings(args),
    )
    bound = await gateway.start(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # One JSON line on stdout, so scripts that bind port 0 learn the real port.
    print(json.dumps({"event": "listening", "target": f"{host}:{bound}"}), flush=True)
    await stop.wait()
    await gateway.stop()
    return 0


def _traffic(admin: SyncAdminClient, args: argparse.Namespace) -> dict[str, Any]:
    """Send messages in steps of up to 500 at `--rate`, then inject their receipts."""
    mix = TrafficMix(
        progress_rate=args.progress_rate,
        duplicate_rate=args.duplicate_rate,
        result_before_progress_rate=args.result_before_progress_rate,
        conflicting_final_rate=args.conflicting_final_rate,
        unknown_id_rate=args.unknown_id_rate,
        malformed_rate=args.malformed_rate,
        lying_route_rate=args.lying_route_rate,
    )
    totals: dict[str, Any] = {"messages": 0, "receipts": 0, "enqueued": 0, "dropped_at_cap": 0}
    verifying = random.Random(args.seed)
    step = max(1, min(500, int(args.rate))) if args.rate else 500
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        out = (
            stack.enter_context(open(args.submissions_out, "a", encoding="utf-8"))
            if args.submissions_out
            else None
        )
        verified_out = (
            stack.enter_context(open(args.verifications_out, "a", encoding="utf-8"))
            if args.verifications_out
            else None
        )
        for first in range(0, args.messages, step):
            batch = scenario(args.seed, min(step, args.messages - first), mix, first)
            admin.send(batch.messages)
            if out is not None:
                # The sender records its messages before their receipts can arrive.
                out.writelines(json.dumps(line) + "\n" for line in batch.submissions())
                out.flush()
            result = admin.inject(batch.receipts)
            if verified_out is not None:
                verified = batch.verifications(verifying, args.verify_rate)
                verified_out.writelines(json.dumps(line) + "\n" for line in verified)
                verified_out.flush()
            totals["messages"] += len(batch.messages)
            totals["receipts"] += len(batch.receipts)
            totals["enqueued"] += result["enqueued"]
            totals["dropped_at_cap"] += result["dropped_at_cap"]
            if args.rate:
                ahead = totals["messages"] / args.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
    return totals


def _admin_command(args: argparse.Namespace) -> int:
    totals: dict[str, Any] = {}
    with SyncAdminClient(args.target, args.login, args.password) as admin:
        if args.command == "traffic":
            totals = _traffic(admin, args)
        elif args.command == "stats":
            totals = admin.stats()
        elif args.command == "faults":
            changes: dict[str, Any] = {}
            for item in args.set:
                knob, _, value = item.partition("=")
                changes[knob] = json.loads(value)
            totals = admin.faults(**changes)
        else:
            call = {"inject": admin.inject, "send": admin.send, "report": admin.report}[
                args.command
            ]
            with _open_input(args.file) as stream:
                for chunk in _chunks(_json_lines(stream)):
                    for key, value in call(chunk).items():
                        totals[key] = totals.get(key, 0) + value
    print(json.dumps(totals, sort_keys=True))
    return 0


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when installed: Python gRPC streams about twice as fast on it."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `fakegw` console script."""
    args = _parser().parse_args(argv)
    if args.command == "serve":
        with asyncio.Runner(loop_factory=None if args.no_uvloop else _uvloop_factory()) as runner:
            return runner.run(_serve(args))
    try:
        return _admin_command(args)
    except grpc.RpcError as exc:
        print(f"fakegw {args.command}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
