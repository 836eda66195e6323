"""The report's Subscribe against Pull sections: `auto`'s rate against Pull's (its target),
Subscribe's rate and daemon CPU per receipt reported beside Pull's (no target), with fakegw
sharing the cores and with the gateway on a core of its own (`bench.placement`), what a second
process gives, where Subscribe's extra CPU goes, and what stands in the way of `auto` when it
misses its target."""

from __future__ import annotations

import statistics
from typing import Any

from dlrfeed_tools.bench.report_figures import (
    HAND_WRITTEN_HEADING,
    configuration_mode,
    configuration_shape,
    cpu_total,
    daemon_cpu,
    pull_of,
    rate_ratio,
    rate_ratios,
    rate_text,
    ratio_text,
    share,
    verdict,
)

TARGET_AUTO_TO_PULL = 0.95  # `auto` end to end against `pull` with the same processes x streams
APART_HEADING = "## Subscribe against Pull, the gateway on a CPU of its own"
COMPARED_MODES = ("subscribe", "auto")
"""The modes set against `pull` of the same shape: `auto` with its target, `subscribe` reported."""
PER_MESSAGE_WORK = (
    "the work per stream message (grpcio receives and wakes a thread once per message), which "
    "Pull pays once per response"
)


def _rate_cell(measured: dict[str, Any], name: str) -> str:
    """A rate against Pull's with its per-repetition spread, and its verdict for `auto`
    (Subscribe's has no target)."""
    ratios = rate_ratios(measured, name, pull_of(name))
    if configuration_mode(name) != "auto":
        return ratio_text(ratios)
    return f"{ratio_text(ratios)} {verdict(statistics.median(ratios) >= TARGET_AUTO_TO_PULL)}"


def subscribe_section(results: dict[str, Any]) -> list[str]:
    """Subscribe and auto against Pull, where Subscribe's extra CPU goes, and what a second
    process gives, for every processes x streams measured in each mode."""
    configurations = results["configurations"]
    shapes = sorted(
        {configuration_shape(name) for name in configurations if configuration_mode(name) == "pull"}
    )
    rows = []
    for shape in shapes:
        pull_cpu = daemon_cpu(results, f"pull {shape}")
        for mode in COMPARED_MODES:
            name = f"{mode} {shape}"
            if name not in configurations:
                continue
            cpu = daemon_cpu(results, name)
            cpu_text = "n/a"
            if cpu is not None and pull_cpu:
                cpu_text = f"{cpu:.0f} / {pull_cpu:.0f} = {cpu / pull_cpu:.2f}"
            rows.append(f"| `{name}` | {_rate_cell(configurations, name)} | {cpu_text} |")
    if not rows:
        return []
    lines = [
        "",
        "## Subscribe against Pull",
        "",
        "End to end (c) against `pull` with the same processes x streams, and the CPU of the "
        "`dlrfeed run` process(es) per receipt (from the table above). Subscribe is read by "
        "grpcio, a thread per stream; its rate and its cost per receipt are reported beside "
        "Pull's, with no target. `auto` drains a backlog by Pull and must reach "
        f"{TARGET_AUTO_TO_PULL:.2f} of it: target for `auto`, c ≥ {TARGET_AUTO_TO_PULL:.2f} x "
        "Pull's. A rate against Pull's is the median of the ratios within each repetition "
        "(both are measured in every repetition, minutes apart at most), their min-max beside "
        "it: the machine's drift between repetitions leaves each ratio, so it can differ from "
        "the ratio of the two medians in the throughput table.",
        "",
        "| configuration | c / c of pull, median (min-max) of the repetitions (target for "
        f"`auto` ≥ {TARGET_AUTO_TO_PULL:.2f}) | daemon µs per receipt, this / pull |",
        "| --- | --- | --- |",
        *rows,
    ]
    costs = _subscribe_costs(results)
    if costs:
        lines += ["", "Where Subscribe's CPU per receipt goes, against Pull's:", "", *costs]
    by_mode: dict[str, list[str]] = {}
    for name in configurations:
        by_mode.setdefault(configuration_mode(name), []).append(name)
    scaling = []
    for mode, names in by_mode.items():
        one = [n for n in names if configuration_shape(n).startswith("1x")]
        more = [n for n in names if not configuration_shape(n).startswith("1x")]
        for single in one:
            for several in more:
                a, b = (configurations[n]["e2e"]["median"] for n in (single, several))
                cpu_a, cpu_b = daemon_cpu(results, single), daemon_cpu(results, several)
                cpu_text = "n/a" if cpu_a is None or cpu_b is None else f"{cpu_a:.0f} → {cpu_b:.0f}"
                scaling.append(
                    f"| {mode} | `{single}` → `{several}` | {a:,.0f} → {b:,.0f} | "
                    f"{b / a:.2f} | {cpu_text} |"
                )
    if scaling:
        lines += [
            "",
            "`--processes`: what a second process gives on this 2-core machine, where fakegw and "
            "PostgreSQL share the cores (docs/scaling.md reasons from these figures to a larger "
            "host).",
            "",
            "| mode | configurations | c, receipts/s | ratio | daemon µs per receipt |",
            "| --- | --- | --- | --- | --- |",
            *scaling,
        ]
    return lines


def _comparison(
    results: dict[str, Any], name: str, pull_name: str
) -> tuple[float, dict[str, float], dict[str, float]] | None:
    """`name`'s rate over `pull_name`'s, and the CPU per receipt of each process of both."""
    configurations = results["configurations"]
    if pull_name not in configurations:
        return None
    cpu = results.get("cpu_us_per_receipt", {})
    mine, pulls = cpu.get(name, {}).get("e2e"), cpu.get(pull_name, {}).get("e2e")
    if not mine or not pulls or not mine.get("daemon") or not pulls.get("daemon"):
        return None
    return rate_ratio(configurations, name, pull_name), mine, pulls


def _per_process(mine: dict[str, float], pulls: dict[str, float]) -> str:
    """Per receipt, each process on one configuration against Pull's, and what the same cores
    allow from those figures."""
    return (
        f"Per receipt, fakegw {mine.get('fakegw', 0):.0f} µs against "
        f"{pulls.get('fakegw', 0):.0f}, the daemon {mine['daemon']:.0f} against "
        f"{pulls['daemon']:.0f}, PostgreSQL {mine.get('postgres', 0):.0f} against "
        f"{pulls.get('postgres', 0):.0f}: {cpu_total(mine):.0f} µs in all against "
        f"{cpu_total(pulls):.0f}, so on the same cores (busy {mine['cores_busy']:.2f} and "
        f"{pulls['cores_busy']:.2f}) it can reach about "
        f"{cpu_total(pulls) * mine['cores_busy'] / (cpu_total(mine) * pulls['cores_busy']):.2f}"
        " of Pull's rate."
    )


def _subscribe_costs(results: dict[str, Any]) -> list[str]:
    """For each Subscribe configuration, where its CPU per receipt goes against Pull's: an
    explanation of the figures, not a verdict (Subscribe has no target against Pull)."""
    lines = []
    for name in results["configurations"]:
        pull_name = pull_of(name)
        compared = _comparison(results, name, pull_name)
        if configuration_mode(name) != "subscribe" or compared is None:
            continue
        rate, mine, pulls = compared
        lines.append(
            f"- `{name}` runs at {rate:.2f} of `{pull_name}`'s rate at "
            f"{mine['daemon'] / pulls['daemon']:.2f} x its daemon CPU per receipt. "
            + _per_process(mine, pulls)
            + f" The difference is {PER_MESSAGE_WORK}: of the "
            f"{cpu_total(mine) - cpu_total(pulls):.0f} µs more per receipt, the gateway pays "
            f"{mine.get('fakegw', 0) - pulls.get('fakegw', 0):.0f}, the daemon "
            f"{mine['daemon'] - pulls['daemon']:.0f} and PostgreSQL "
            f"{mine.get('postgres', 0) - pulls.get('postgres', 0):.0f}. In the subscribe profile "
            "gRPC (grpcio) takes "
            f"{share(results, 'subscribe', 'gRPC'):.0f} % of the daemon's samples and the event "
            f"loop {share(results, 'subscribe', 'event loop'):.0f} %. The readers measured "
            f"against it are in *{HAND_WRITTEN_HEADING[3:]}*."
            + _apart_sentence(results, name, pull_name)
        )
    return lines


def subscribe_walls(results: dict[str, Any]) -> list[str]:
    """For an `auto` configuration below its target against Pull: the CPU per receipt of each
    process on both, the best rate ratio those allow on the same cores, and why."""
    configurations = results["configurations"]
    walls = []
    for name in configurations:
        pull_name = pull_of(name)
        if configuration_mode(name) != "auto" or pull_name not in configurations:
            continue
        rate = rate_ratio(configurations, name, pull_name)
        if rate >= TARGET_AUTO_TO_PULL:
            continue
        compared = _comparison(results, name, pull_name)
        cpu = ""
        if compared is not None:
            _, mine, pulls = compared
            cpu = (
                f" at {mine['daemon'] / pulls['daemon']:.2f} x its daemon CPU per receipt. "
                + _per_process(mine, pulls)
            )
        walls.append(
            f"- `{name}` reaches {rate:.2f} of `{pull_name}`'s rate (target "
            f"≥ {TARGET_AUTO_TO_PULL:.2f}){cpu or '.'} Each reader starts on Pull and moves "
            "to Subscribe once three Pulls in a row come back less than half full: what it "
            "reads on Subscribe before a backlog sends it back to Pull is paid at Subscribe's "
            f"cost: {PER_MESSAGE_WORK}. Compare the min-max of the repetitions' ratios in "
            "its table: a ratio within their spread is the machine's noise."
            + _apart_sentence(results, name, pull_name)
        )
    return walls


def _apart_sentence(results: dict[str, Any], name: str, pull_name: str) -> str:
    """What the same configuration does once the gateway's work is not on the consumer's CPUs."""
    if (name, pull_name) not in _apart_pairs(results):
        return ""
    rate, cpu = _apart_ratios(results, name, pull_name)
    return (
        f" With the gateway on a CPU of its own (*{APART_HEADING[3:]}*) it reaches {rate:.2f} "
        f"of Pull's rate at {cpu:.2f} x its daemon CPU."
    )


def _apart_pairs(
    results: dict[str, Any], modes: tuple[str, ...] = COMPARED_MODES
) -> list[tuple[str, str]]:
    """(configuration, pull) names of the same shape measured with the gateway apart, for the
    configurations of `modes`."""
    measured = results.get("gateway_apart", {}).get("configurations", {})
    return [
        (name, pull_of(name))
        for name in measured
        if configuration_mode(name) in modes and pull_of(name) in measured
    ]


def _apart_ratios(results: dict[str, Any], name: str, pull_name: str) -> tuple[float, float]:
    """Rate and daemon CPU per receipt of `name` over `pull_name`'s, the gateway apart."""
    measured = results["gateway_apart"]["configurations"]
    rate = rate_ratio(measured, name, pull_name)
    cpu = measured[name]["cpu"]["daemon"] / measured[pull_name]["cpu"]["daemon"]
    return rate, cpu


def gateway_apart_section(results: dict[str, Any]) -> list[str]:
    """Subscribe (and `auto`, when measured so) against Pull with fakegw on one CPU and the
    consumer on the others."""
    apart = results.get("gateway_apart")
    if not apart:
        return []
    measured = apart["configurations"]
    ratios = {name: _apart_ratios(results, name, pull) for name, pull in _apart_pairs(results)}
    rows = []
    for name, figures in measured.items():
        cpu = figures["cpu"]
        rate_cell, cpu_ratio = "", ""
        if name in ratios:
            rate_cell = _rate_cell(measured, name)
            cpu_ratio = f"{ratios[name][1]:.2f}"
        rows.append(
            f"| `{name}` | {rate_text(figures['e2e'])} | {rate_cell} | "
            f"{cpu.get('daemon', 0):.0f} | {cpu_ratio} | {cpu.get('fakegw', 0):.0f} | "
            f"{cpu.get('postgres', 0):.0f} | {cpu['cores_busy']:.2f} |"
        )
    gateway = _cpu_list(apart["gateway_cpus"])
    consumer = _cpu_list(apart["consumer_cpus"])
    return [
        "",
        APART_HEADING,
        "",
        "The gateway's work kept off the consumer's CPUs, as it is in production, where a "
        f"gateway runs on its provider's hosts. Here fakegw is pinned to {gateway} and "
        f"PostgreSQL and the daemon to {consumer} for each measurement (`bench.placement`), so "
        "what fakegw spends per receipt is no longer taken from the consumer: on Subscribe one "
        "write and one completion per stream message, on Pull a share of one response. Same "
        "receipts and defaults as (c) above, interleaved with its repetitions. The consumer "
        "has fewer CPUs than above, so both modes may run slower; the ratios are what this "
        "measures, each the median of the repetitions' ratios as above. As above, "
        "Subscribe's ratios are reported with no target; `auto`'s rate, where measured so, "
        f"has its target of {TARGET_AUTO_TO_PULL:.2f}.",
        "",
        "| configuration | c, receipts/s | c / c of pull, median (min-max) of the repetitions "
        f"(target for `auto` ≥ {TARGET_AUTO_TO_PULL:.2f}) | daemon µs per receipt | this / "
        "pull | fakegw µs | "
        "PostgreSQL µs | cores busy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
    ]


def subscribe_glance(results: dict[str, Any]) -> list[str]:
    """Per placement: each `auto` configuration's rate against Pull with its verdict, then
    each Subscribe configuration's two ratios against Pull, reported with no target."""
    lines = []
    placements = (
        ("fakegw sharing the cores", _shared_ratios(results)),
        (
            "the gateway on a CPU of its own",
            {name: _apart_ratios(results, name, pull) for name, pull in _apart_pairs(results)},
        ),
    )
    for placement, measured in placements:
        auto = [
            f"`{name}` rate {rate:.2f} ({verdict(rate >= TARGET_AUTO_TO_PULL)}, ≥ "
            f"{TARGET_AUTO_TO_PULL:.2f})"
            for name, (rate, _) in measured.items()
            if configuration_mode(name) == "auto"
        ]
        if auto:
            lines.append(f"- `auto` against Pull, {placement}: {'; '.join(auto)}")
    for placement, measured in placements:
        subscribe = [
            f"`{name}` rate {rate:.2f}" + ("" if cpu is None else f", daemon CPU {cpu:.2f}")
            for name, (rate, cpu) in measured.items()
            if configuration_mode(name) == "subscribe"
        ]
        if subscribe:
            lines.append(
                f"- Subscribe against Pull, {placement} (reported, no target): "
                f"{'; '.join(subscribe)}"
            )
    return lines


def _shared_ratios(results: dict[str, Any]) -> dict[str, tuple[float, float | None]]:
    """Rate and daemon CPU per receipt over Pull's of the same shape, fakegw sharing the cores,
    for each configuration of the compared modes."""
    configurations = results["configurations"]
    measured: dict[str, tuple[float, float | None]] = {}
    for name in configurations:
        pull_name = pull_of(name)
        if configuration_mode(name) not in COMPARED_MODES or pull_name not in configurations:
            continue
        rate = rate_ratio(configurations, name, pull_name)
        cpu, pull_cpu = daemon_cpu(results, name), daemon_cpu(results, pull_name)
        measured[name] = (rate, None if cpu is None or not pull_cpu else cpu / pull_cpu)
    return measured


def _cpu_list(cpus: list[int]) -> str:
    """ "CPU 0" or "CPUs 1, 2, 3"."""
    return f"CPU{'s' if len(cpus) > 1 else ''} {', '.join(map(str, cpus))}"
