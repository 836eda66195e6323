"""monitoring/: the alert rules pass `promtool check rules` and their own `promtool test rules`
unit tests; every metric (and label) that the rules and the Grafana dashboard name is one a
live process exports — a real `dlrfeed run` against the fake gateway and PostgreSQL, and a real
`dlrfeed relay` pushing its changes to a real HTTP endpoint (scripts/webhook_receiver.py), each
scraped over HTTP — and `promtool check metrics` finds both scrapes clean."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dlrfeed.daemon.app import Daemon
from dlrfeed.relay import Relay, RelaySettings
from dlrfeed.store import Store, Submission, Verification
from dlrfeed_tools.daemon_harness import (
    LOGIN,
    drained,
    receipt_bodies,
    running_gateway,
    settings_for,
    wait_until,
)
from dlrfeed_tools.pgcluster import PgCluster, free_port
from dlrfeed_tools.webhook_receiver import read_log

REPO = Path(__file__).resolve().parents[2]

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
RULES = MONITORING / "dlrfeed-alerts.yml"
RULE_TESTS = MONITORING / "dlrfeed-alerts.test.yml"
DASHBOARD = MONITORING / "dlrfeed-dashboard.json"

RELAY_PREFIX = "dlrfeed_relay_"
"""Metrics of the relay, a process of its own: checked against the relay's scrape."""

RELAY_METRICS = frozenset(
    {
        "dlrfeed_relay_lag_seconds",
        "dlrfeed_relay_pending_changes",
        "dlrfeed_relay_delivered_total",
        "dlrfeed_relay_attempt_failures_total",
        "dlrfeed_relay_up",
    }
)

WEBHOOK_PREFIX = "dlrfeed_webhook_"
"""Metrics of the callback receiver, a process of its own: checked against its scrape."""

WEBHOOK_METRICS = frozenset(
    {
        "dlrfeed_webhook_store_up",
        "dlrfeed_webhook_requests_total",
        "dlrfeed_webhook_unreadable_total",
    }
)

PROMETHEUS_SERIES = frozenset({"up"})
"""Series Prometheus itself writes for every target it scrapes."""

SCRAPE_LABELS = frozenset({"job", "instance"})
"""Labels Prometheus adds to every scraped series."""

# PromQL words that are never metric names.
_KEYWORDS = frozenset(
    {
        *("and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"),
        *("offset", "bool", "inf", "nan", "atan2", "sum", "min", "max", "avg", "group"),
        *("stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile"),
    }
)
_GROUPING = frozenset(["by", "without", "on", "ignoring", "group_left", "group_right"])
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NUMBER = re.compile(r"[\w.]+")  # 0.99, 1e3, and durations: 5m, 1d
_MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass
class Selector:
    """One vector selector of a query: a metric name and its label matchers."""

    metric: str
    matchers: dict[str, tuple[str, str]] = field(default_factory=dict)


def selectors(expr: str) -> list[Selector]:
    """The vector selectors of a PromQL expression, in order: every name that is not a
    function, an aggregation, a keyword, or a label (of a matcher or a grouping clause)."""
    found: list[Selector] = []
    i = 0
    while i < len(expr):
        char = expr[i]
        if char == "#":  # a comment, to the end of its line
            newline = expr.find("\n", i)
            i = len(expr) if newline < 0 else newline
        elif char in "\"'`":
            i = expr.index(char, i + 1) + 1
        elif char == "[":
            i = expr.index("]", i) + 1
        elif char == "{":
            end = expr.index("}", i)
            assert found, f"a selector without a metric name in {expr!r}"
            for label, op, value in _MATCHER.findall(expr[i + 1 : end]):
                found[-1].matchers[label] = (op, value)
            i = end + 1
        elif char.isdigit():
            number = _NUMBER.match(expr, i)
            assert number is not None  # a digit always starts one
            i = number.end()
        elif match := _NAME.match(expr, i):
            name, i = match.group(), match.end()
            rest = expr[i:].lstrip()
            if name in _GROUPING and rest.startswith("("):
                i = expr.index(")", i) + 1
            elif name not in _KEYWORDS and not rest.startswith("("):
                found.append(Selector(name))
        else:
            i += 1
    return found


def _promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run `make install` (scripts/ensure-system-packages.sh)"
    return subprocess.run(
        [promtool, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=MONITORING,
    )


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _dashboard_queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every templating query of the dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        # Grafana's label_values(SELECTOR, LABEL): only the selector is PromQL.
        match = re.fullmatch(r"label_values\((.*),\s*\w+\)", variable["definition"])
        assert match, variable["definition"]
        yield f"variable ${variable['name']}", match.group(1)


def _as_promql(query: str) -> str:
    """A dashboard query with Grafana's variables filled in as Prometheus would receive it."""
    return re.sub(r"\$\w+", ".*", query.replace("$__rate_interval", "5m"))


def test_selectors_finds_metrics_and_matchers_but_no_functions_keywords_or_labels() -> None:
    expr = (
        "# the sum of all a, not b\n"
        'sum by (job, le) (rate(a_total{x="1", y=~"$v"}[5m] offset 1d)) > on (job) '
        '3 * b:recorded unless histogram_quantile(0.9, c_bucket{le="+Inf"}) or vector(1)'
    )
    assert [(s.metric, s.matchers) for s in selectors(expr)] == [
        ("a_total", {"x": ("=", "1"), "y": ("=~", "$v")}),
        ("b:recorded", {}),
        ("c_bucket", {"le": ("=", "+Inf")}),
    ]


def test_alert_rules_pass_promtool_check_and_their_unit_tests() -> None:
    checked = _promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in checked.stdout
    tested = _promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert has a unit test, and every unit test names an alert that exists.
    alerts = {rule["alert"] for rule in _rules() if "alert" in rule}
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    tested_alerts = {case["alertname"] for test in tests for case in test["alert_rule_test"]}
    assert tested_alerts == alerts


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """Each query, variables filled in, as a recording rule that `promtool check rules` parses."""
    queries = list(_dashboard_queries())
    rules = [
        {"record": f"dashboard:query_{n}", "expr": _as_promql(query)}
        for n, (_, query) in enumerate(queries)
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = _promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(queries)} rules found" in checked.stdout


@dataclass
class Scrape:
    """What one /metrics answer holds: sample names, each with its label names and values."""

    text: str
    labels: dict[str, dict[str, set[str]]]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        labels: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                by_label = labels[sample.name]
                for label, value in sample.labels.items():
                    by_label[label].add(value)
        return cls(text, labels)

    def value(self, name: str) -> float:
        (sample,) = [
            s
            for f in text_string_to_metric_families(self.text)
            for s in f.samples
            if s.name == name
        ]
        return float(sample.value)


async def _try_scrape(port: int) -> Scrape | None:
    """The scrape, or None while nothing listens on `port` yet."""
    try:
        return await _scrape(port)
    except OSError:
        return None


async def _scrape(port: int) -> Scrape:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
    await writer.drain()
    response = (await reader.read()).decode()
    writer.close()
    head, body = response.split("\r\n\r\n", 1)
    assert head.split()[1] == "200", head
    return Scrape.parse(body)


async def _spawn(log_path: Path, *args: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLRFEED_")}
    env.pop("NOTIFY_SOCKET", None)
    with log_path.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable, *args, env=env, stdout=log, stderr=log, cwd=REPO
        )


async def _finish(process: asyncio.subprocess.Process) -> int:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(process.wait(), 30)


async def _relay_scrape(database_url: str, tmp_path: Path) -> Scrape:
    """A real `dlrfeed relay --metrics` delivering the change log to a real endpoint that
    answers the first two batches 503: scraped once everything is delivered."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"monitoring-secret")
    secret.chmod(0o600)
    hook_port, metrics_port = free_port(), free_port()
    receiver = await _spawn(
        tmp_path / "receiver.out", str(REPO / "scripts" / "webhook_receiver.py"),
        "--port", str(hook_port), "--secret-file", str(secret),
        "--log", str(tmp_path / "received.jsonl"), "--script", "503,503",
    )  # fmt: skip
    relay: asyncio.subprocess.Process | None = None
    try:

        async def listening() -> bool:
            return "listening" in (tmp_path / "receiver.out").read_text()

        await wait_until(listening, 20, "the webhook receiver to listen")
        relay = await _spawn(
            tmp_path / "relay.log", "-m", "dlrfeed.cli", "relay",
            "--url", f"http://127.0.0.1:{hook_port}/hook", "--secret-file", str(secret),
            "--database-url", database_url, "--batch-size", "100", "--retry-max", "0.5",
            "--metrics", f"127.0.0.1:{metrics_port}", "--log-format", "json",
        )  # fmt: skip
        conn = await asyncpg.connect(database_url)
        try:
            changes = int(await conn.fetchval("SELECT count(*) FROM dlr.status_changes"))
        finally:
            await conn.close()
        assert changes > 0

        async def delivered() -> bool:
            scrape = await _try_scrape(metrics_port)
            return (
                scrape is not None
                and scrape.value("dlrfeed_relay_delivered_total") == changes
                and scrape.value("dlrfeed_relay_pending_changes") == 0
            )

        await wait_until(delivered, 120, "the relay to deliver every change")
        scrape = await _scrape(metrics_port)
    finally:
        codes = [await _finish(relay)] if relay is not None else []
        receiver.kill()
        await receiver.wait()
    assert codes == [0], (tmp_path / "relay.log").read_text()[-2000:]
    received = read_log(tmp_path / "received.jsonl")
    assert all(entry["signature_valid"] for entry in received)
    assert len({c["position"] for e in received for c in e["changes"]}) == changes
    return scrape


async def _webhook_scrape(database_url: str, tmp_path: Path) -> Scrape:
    """A real `dlrfeed webhook --metrics` taken one good callback, one it cannot read and one
    without the secret: scraped once it has answered all three."""
    secret = tmp_path / "webhook-secret"
    secret.write_bytes(b"monitoring-webhook-secret")
    secret.chmod(0o600)
    port, metrics_port = free_port(), free_port()
    receiver = await _spawn(
        tmp_path / "webhook.log", "-m", "dlrfeed.cli", "webhook",
        "--listen", f"127.0.0.1:{port}", "--login", "acme", "--database-url", database_url,
        "--secret-file", str(secret), "--metrics", f"127.0.0.1:{metrics_port}",
        "--log-format", "json",
    )  # fmt: skip
    authorized = {"Authorization": "Bearer monitoring-webhook-secret"}
    try:
        await wait_until(
            lambda: _answers(f"http://127.0.0.1:{port}/dlr"), 30, "the receiver to listen"
        )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            good = await client.post("/dlr", json={"id": "w1", "level": 2}, headers=authorized)
            bad = await client.post("/dlr", content=b"not json", headers=authorized)
            refused = await client.post("/dlr", json={"id": "w1", "level": 2})
        assert (good.status_code, bad.status_code, refused.status_code) == (200, 400, 401)
        scrape = await _scrape(metrics_port)
    finally:
        code = await _finish(receiver)
    assert code == 0, (tmp_path / "webhook.log").read_text()[-2000:]
    return scrape


async def _answers(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as client:
            await client.get(url)
    except httpx.TransportError:
        return False
    return True


async def test_live_scrape_has_every_metric_of_rules_and_dashboard_and_is_promtool_clean(
    database_url: str, tmp_path: Path
) -> None:
    """A real daemon drains a backlog (with conflicts and uncorrelated receipts), is blocked
    on a table lock mid-drain — the backlog gauge then says so — and is scraped; then a real
    relay pushes the status changes that drain made and is scraped. Every name and label the
    rules and the dashboard use must be in what the two export."""
    bodies = receipt_bodies(30_000, conflicting=50)
    store = await Store.open(database_url, pool_size=1)
    try:  # statuses, hence changes for the relay, for a thousand of the messages
        with_status = sorted({b["id"] for b in bodies})[:1000]
        await store.record_submissions([Submission(LOGIN, m, "+34600000000") for m in with_status])
        # One verified message: the route gauges have verifiable traffic to measure (C6).
        verified = Verification(LOGIN, with_status[0], "otp_confirmed", datetime.now(UTC))
        await store.record_verifications([verified])
    finally:
        await store.close()
    async with running_gateway() as gateway:
        await gateway.inject(LOGIN, bodies)
        settings = settings_for(
            gateway.target, database_url, "--metrics", "127.0.0.1:0", "--mode", "pull",
            "--streams", "1",
        )  # fmt: skip
        daemon = Daemon(settings)
        task = asyncio.create_task(daemon.run(), name="daemon-under-test")
        blocker = await asyncpg.connect(database_url)
        try:

            async def some_stored() -> bool:
                count = await blocker.fetchval("SELECT count(*) FROM dlr.receptions")
                return bool(count >= 2000)

            await wait_until(some_stored, 60, "the first batches to commit")
            # Every later ingest waits on this lock: the daemon holds a backlog it cannot store.
            # The table, not the view: locking the view also locks the events it reads, in an
            # order an ingest in progress can deadlock with.
            locked = blocker.transaction()
            await locked.start()
            await blocker.execute("LOCK TABLE dlr.reception_rows IN ACCESS EXCLUSIVE MODE")

            async def stalled_on_a_backlog() -> bool:
                return (await _scrape(daemon.metrics_port)).value("dlrfeed_readers_backlogged") == 1

            await wait_until(stalled_on_a_backlog, 30, "the backlog gauge while blocked")
            blocked = await _scrape(daemon.metrics_port)
            await locked.rollback()
        finally:
            await blocker.close()
        await wait_until(lambda: drained(gateway), 120, "the drain")
        idle = await _scrape(daemon.metrics_port)
        daemon.stop()
        assert await asyncio.wait_for(task, 30) == 0

    assert blocked.value("dlrfeed_receipts_in_flight") > 0
    # Drained and idle: no reader holds anything, so no backlog is claimed any more.
    assert idle.value("dlrfeed_readers_backlogged") == 0
    assert idle.value("dlrfeed_readers_configured") == 1
    assert idle.value("dlrfeed_receipts_in_flight") == 0
    # The route gauges, computed at start: the one route (none) of these messages. Whether a
    # signal fired depends on how much the drain had stored by then (one verification among a
    # thousand DELIVRDs is suspicious), so only the export is checked here; the signals are
    # test_route_gauges' and test_verifications'.
    assert idle.labels["dlrfeed_route_suspicious"]["route"] == {"(none)"}
    assert idle.value("dlrfeed_route_suspicious") in (0, 1)

    relay = await _relay_scrape(database_url, tmp_path)
    assert relay.value("dlrfeed_relay_up") == 1
    assert relay.value("dlrfeed_relay_lag_seconds") == 0
    assert relay.value("dlrfeed_relay_attempt_failures_total") >= 2  # the two 503s

    webhook = await _webhook_scrape(database_url, tmp_path)
    assert webhook.value("dlrfeed_webhook_store_up") == 1
    assert webhook.value("dlrfeed_webhook_unreadable_total") == 1

    for scrape in (idle, relay, webhook):
        linted = _promtool("check", "metrics", stdin=scrape.text)
        assert linted.returncode == 0, linted.stdout + linted.stderr
        assert linted.stdout + linted.stderr == ""

    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    used = [(f"rule {rule.get('alert') or rule['record']}", rule["expr"]) for rule in _rules()]
    used += list(_dashboard_queries())
    checked: set[str] = set()
    for where, query in used:
        for selector in selectors(query):
            name = selector.metric
            if name in PROMETHEUS_SERIES or name in recorded:
                continue
            if name.startswith(RELAY_PREFIX):
                process, scrape = "relay", relay
            elif name.startswith(WEBHOOK_PREFIX):
                process, scrape = "webhook receiver", webhook
            else:
                process, scrape = "daemon", idle
            assert name in scrape.labels, f"{where}: the {process} exports no {name}"
            exported = scrape.labels[name]
            for label, (op, value) in selector.matchers.items():
                if label in SCRAPE_LABELS:
                    continue
                assert label in exported, f"{where}: {name} has no label {label}"
                if op == "=" and "$" not in value:
                    assert value in exported[label], f"{where}: {name}{{{label}={value!r}}}"
            checked.add(name)
    # Far from vacuous: the rules and the dashboard cover the daemon's metrics, and every one
    # of the relay's.
    assert len(checked - RELAY_METRICS - WEBHOOK_METRICS) >= 20, sorted(checked)
    assert {name for name in checked if name.startswith(RELAY_PREFIX)} == RELAY_METRICS
    assert {name for name in checked if name.startswith(WEBHOOK_PREFIX)} == WEBHOOK_METRICS


async def test_relay_up_is_zero_while_postgresql_refuses_it_and_one_again_after(
    pg_cluster: PgCluster, database_url: str
) -> None:
    """What DlrfeedRelayDown keys on: a relay that runs but cannot reach PostgreSQL (its
    database stops taking connections, its sessions are ended) says 0, and 1 once it is back."""
    database = database_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(pg_cluster.dsn)
    settings = RelaySettings(
        database_url=database_url,
        url="http://127.0.0.1:1/hook",  # never called: there is nothing to deliver
        secret=b"unused",
        metrics_interval=0.1,
    )
    relay = Relay(settings)
    stop = asyncio.Event()
    running = asyncio.create_task(relay.run(stop), name="relay-under-test")

    def up() -> float:
        return float(relay.metrics.up._value.get())  # prometheus_client has no public getter

    async def is_up() -> bool:
        return up() == 1

    async def is_down() -> bool:
        return up() == 0

    try:
        await wait_until(is_up, 30, "the relay to be up")
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", database
        )
        await wait_until(is_down, 30, "dlrfeed_relay_up to say 0")
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await wait_until(is_up, 30, "dlrfeed_relay_up to say 1 again")
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()
        stop.set()
        await asyncio.wait_for(running, 30)
    assert up() == 0  # stopped
