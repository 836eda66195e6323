"""monitoring/: the alert rules pass `promtool check rules` and their own `promtool test rules`
unit tests; every metric (and label) that the rules and the Grafana dashboard name is one a
live daemon exports — a real `dlrfeed run` against the fake gateway and PostgreSQL, scraped
over HTTP — and `promtool check metrics` finds that scrape clean."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import yaml
from prometheus_client.parser import text_string_to_metric_families

from daemon_harness import LOGIN, drained, receipt_bodies, running_gateway, settings_for, wait_until
from dlrfeed.daemon.app import Daemon

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
RULES = MONITORING / "dlrfeed-alerts.yml"
RULE_TESTS = MONITORING / "dlrfeed-alerts.test.yml"
DASHBOARD = MONITORING / "dlrfeed-dashboard.json"

NOT_YET_SCRAPED_PREFIX = "dlrfeed_relay_"
"""Metrics of the relay, a process of its own that this test does not start: exempt from the
live-scrape check until its scrape is wired in; they must still be the announced names."""

RELAY_METRICS = frozenset(
    {
        "dlrfeed_relay_lag_seconds",
        "dlrfeed_relay_pending_changes",
        "dlrfeed_relay_delivered_total",
        "dlrfeed_relay_attempt_failures_total",
        "dlrfeed_relay_up",
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


async def _scrape(port: int) -> Scrape:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
    await writer.drain()
    response = (await reader.read()).decode()
    writer.close()
    head, body = response.split("\r\n\r\n", 1)
    assert head.split()[1] == "200", head
    return Scrape.parse(body)


async def test_live_scrape_has_every_metric_of_rules_and_dashboard_and_is_promtool_clean(
    database_url: str,
) -> None:
    """A real daemon drains a backlog (with conflicts and uncorrelated receipts), is blocked
    on a table lock mid-drain — the backlog gauge then says so — and is scraped; every name and
    label the rules and the dashboard use must be in what it exports."""
    async with running_gateway() as gateway:
        await gateway.inject(LOGIN, receipt_bodies(30_000, conflicting=50))
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
            locked = blocker.transaction()
            await locked.start()
            await blocker.execute("LOCK TABLE dlr.receptions IN ACCESS EXCLUSIVE MODE")

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

    linted = _promtool("check", "metrics", stdin=idle.text)
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
            if name.startswith(NOT_YET_SCRAPED_PREFIX):
                assert name in RELAY_METRICS, f"{where}: {name} is not a relay metric"
                continue
            assert name in idle.labels, f"{where}: the daemon exports no {name}"
            exported = idle.labels[name]
            for label, (op, value) in selector.matchers.items():
                if label in SCRAPE_LABELS:
                    continue
                assert label in exported, f"{where}: {name} has no label {label}"
                if op == "=" and "$" not in value:
                    assert value in exported[label], f"{where}: {name}{{{label}={value!r}}}"
            checked.add(name)
    # Far from vacuous: the rules and the dashboard cover the daemon's metrics.
    assert len(checked) >= 20, sorted(checked)
