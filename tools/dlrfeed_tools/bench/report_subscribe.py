"""The report's Subscribe against Pull sections: the primary path's rate and daemon CPU per
receipt against the fallback's, with fakegw sharing the cores and with the gateway on a core
of its own (`bench.placement`), what a second process gives, and what stands in the way of a
target not met."""

from __future__ import annotations

from typing import Any

from dlrfeed_tools.bench.report_figures import (
    HAND_WRITTEN_HEADING,
    configuration_mode,
    configuration_shape,
    cpu_total,
    daemon_cpu,
    pull_of,
    rate_text,
    share,
    verdict,
)

TARGET_SUBSCRIBE_TO_PULL = 0.85  # Subscribe, the primary path, end to end against Pull
TARGET_SUBSCRIBE_CPU_TO_PULL = 1.3  # the daemon's CPU per receipt on Subscribe against Pull
APART_HEADING = "## Subscribe against Pull, the gateway on a CPU of its own"


def subscribe_section(results: dict[str, Any]) -> list[str]:
    """Subscribe (the primary path) and auto against Pull, and what a second process gives,
    for every processes x streams measured in each mode."""
    configurations = results["configurations"]
    shapes = sorted(
        {configuration_shape(name) for name in configurations if configuration_mode(name) == "pull"}
    )
    rows = []
    for shape in shapes:
        pull = configurations[f"pull {shape}"]["e2e"]["median"]
        pull_cpu = daemon_cpu(results, f"pull {shape}")
        for mode in ("subscribe", "auto"):
            name = f"{mode} {shape}"
            if name not in configurations:
                continue
            rate = configurations[name]["e2e"]["median"] / pull
            cpu = daemon_cpu(results, name)
            cpu_text = "n/a"
            if cpu is not None and pull_cpu:
                met = verdict(cpu / pull_cpu <= TARGET_SUBSCRIBE_CPU_TO_PULL)
                cpu_text = f"{cpu:.0f} / {pull_cpu:.0f} = {cpu / pull_cpu:.2f}"
                cpu_text += f" {met}" if mode == "subscribe" else ""
            rate_cell = f"{rate:.2f}"
            rate_cell += (
                f" {verdict(rate >= TARGET_SUBSCRIBE_TO_PULL)}" if mode == "subscribe" else ""
            )
            rows.append(f"| `{name}` | {rate_cell} | {cpu_text} |")
    if not rows:
        return []
    lines = [
        "",
        "## Subscribe against Pull",
        "",
        "Subscribe is the primary path, Pull the fallback. End to end (c) against `pull` with "
        "the same processes x streams, and the CPU of the `dlrfeed run` process(es) per "
        "receipt (from the table above). Targets for Subscribe: rate ≥ "
        f"{TARGET_SUBSCRIBE_TO_PULL:.2f} x Pull's, CPU ≤ {TARGET_SUBSCRIBE_CPU_TO_PULL:.1f} x "
        "Pull's; `auto` is shown for reference (it drains a backlog on Pull).",
        "",
        f"| configuration | c / c of pull (target ≥ {TARGET_SUBSCRIBE_TO_PULL:.2f}) | "
        f"daemon µs per receipt, this / pull (target ≤ {TARGET_SUBSCRIBE_CPU_TO_PULL:.1f}) |",
        "| --- | --- | --- |",
        *rows,
    ]
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


def subscribe_walls(results: dict[str, Any]) -> list[str]:
    """For a Subscribe configuration below its targets against Pull: the CPU per receipt of
    each process on both, the best rate ratio those allow on the same cores, and the profile."""
    configurations = results["configurations"]
    cpu = results.get("cpu_us_per_receipt", {})
    walls = []
    for name in configurations:
        pull_name = pull_of(name)
        if configuration_mode(name) != "subscribe" or pull_name not in configurations:
            continue
        rate = configurations[name]["e2e"]["median"] / configurations[pull_name]["e2e"]["median"]
        mine, pulls = cpu.get(name, {}).get("e2e"), cpu.get(pull_name, {}).get("e2e")
        if not mine or not pulls or not mine.get("daemon") or not pulls.get("daemon"):
            continue
        cpu_ratio = mine["daemon"] / pulls["daemon"]
        if rate >= TARGET_SUBSCRIBE_TO_PULL and cpu_ratio <= TARGET_SUBSCRIBE_CPU_TO_PULL:
            continue
        walls.append(
            f"- `{name}` reaches {rate:.2f} of `{pull_name}`'s rate at {cpu_ratio:.2f} x its "
            f"daemon CPU per receipt. Per receipt, fakegw {mine.get('fakegw', 0):.0f} µs "
            f"against {pulls.get('fakegw', 0):.0f}, the daemon {mine['daemon']:.0f} against "
            f"{pulls['daemon']:.0f}, PostgreSQL {mine.get('postgres', 0):.0f} against "
            f"{pulls.get('postgres', 0):.0f}: {cpu_total(mine):.0f} µs in all against "
            f"{cpu_total(pulls):.0f}, so on the same cores (busy {mine['cores_busy']:.2f} and "
            f"{pulls['cores_busy']:.2f}) Subscribe can reach about "
            f"{cpu_total(pulls) * mine['cores_busy'] / (cpu_total(mine) * pulls['cores_busy']):.2f}"
            " of Pull's rate. The difference is the work per stream message (an HTTP/2 DATA "
            "frame each), which Pull pays once per response: of the "
            f"{cpu_total(mine) - cpu_total(pulls):.0f} µs more per receipt, the gateway pays "
            f"{mine.get('fakegw', 0) - pulls.get('fakegw', 0):.0f}, the daemon "
            f"{mine['daemon'] - pulls['daemon']:.0f} and PostgreSQL "
            f"{mine.get('postgres', 0) - pulls.get('postgres', 0):.0f}. In the subscribe profile "
            "gRPC (grpcio) takes "
            f"{share(results, 'subscribe', 'gRPC'):.0f} % of the daemon's samples and the event "
            f"loop {share(results, 'subscribe', 'event loop'):.0f} %. The candidates tried "
            f"against it are in *{HAND_WRITTEN_HEADING[3:]}*."
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


def _apart_pairs(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(subscribe, pull) configuration names of the same shape measured with the gateway apart."""
    measured = results.get("gateway_apart", {}).get("configurations", {})
    return [
        (name, pull_of(name))
        for name in measured
        if configuration_mode(name) == "subscribe" and pull_of(name) in measured
    ]


def _apart_ratios(results: dict[str, Any], name: str, pull_name: str) -> tuple[float, float]:
    """Rate and daemon CPU per receipt of `name` over `pull_name`'s, the gateway apart."""
    measured = results["gateway_apart"]["configurations"]
    rate = measured[name]["e2e"]["median"] / measured[pull_name]["e2e"]["median"]
    cpu = measured[name]["cpu"]["daemon"] / measured[pull_name]["cpu"]["daemon"]
    return rate, cpu


def gateway_apart_section(results: dict[str, Any]) -> list[str]:
    """Subscribe against Pull with fakegw on one CPU and the consumer on the others."""
    apart = results.get("gateway_apart")
    if not apart:
        return []
    measured = apart["configurations"]
    ratios = {name: _apart_ratios(results, name, pull) for name, pull in _apart_pairs(results)}
    rows = []
    for name, figures in measured.items():
        cpu = figures["cpu"]
        rate_ratio, cpu_ratio = "", ""
        if name in ratios:
            rate, daemon = ratios[name]
            rate_ratio = f"{rate:.2f} {verdict(rate >= TARGET_SUBSCRIBE_TO_PULL)}"
            cpu_ratio = f"{daemon:.2f} {verdict(daemon <= TARGET_SUBSCRIBE_CPU_TO_PULL)}"
        rows.append(
            f"| `{name}` | {rate_text(figures['e2e'])} | {rate_ratio} | "
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
        "measures.",
        "",
        "| configuration | c, receipts/s | c / c of pull (target ≥ "
        f"{TARGET_SUBSCRIBE_TO_PULL:.2f}) | daemon µs per receipt | this / pull (target ≤ "
        f"{TARGET_SUBSCRIBE_CPU_TO_PULL:.1f}) | fakegw µs | PostgreSQL µs | cores busy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
    ]


def subscribe_glance(results: dict[str, Any]) -> list[str]:
    """One line per placement: each Subscribe configuration's two ratios against Pull."""
    lines = []
    configurations = results["configurations"]
    shared = []
    for name in configurations:
        pull_name = pull_of(name)
        cpu, pull_cpu = daemon_cpu(results, name), daemon_cpu(results, pull_name)
        if configuration_mode(name) != "subscribe" or pull_name not in configurations:
            continue
        if cpu is None or not pull_cpu:
            continue
        rate = configurations[name]["e2e"]["median"] / configurations[pull_name]["e2e"]["median"]
        shared.append(_ratio_pair(name, rate, cpu / pull_cpu))
    if shared:
        lines.append(f"- Subscribe against Pull, fakegw sharing the cores: {'; '.join(shared)}")
    apart = [
        _ratio_pair(name, *_apart_ratios(results, name, pull))
        for name, pull in _apart_pairs(results)
    ]
    if apart:
        lines.append(
            f"- Subscribe against Pull, the gateway on a CPU of its own: {'; '.join(apart)}"
        )
    return lines


def _cpu_list(cpus: list[int]) -> str:
    """ "CPU 0" or "CPUs 1, 2, 3"."""
    return f"CPU{'s' if len(cpus) > 1 else ''} {', '.join(map(str, cpus))}"


def _ratio_pair(name: str, rate: float, cpu: float) -> str:
    """`name`'s rate and daemon CPU against Pull's, each with its verdict."""
    return (
        f"`{name}` rate {rate:.2f} ({verdict(rate >= TARGET_SUBSCRIBE_TO_PULL)}, ≥ "
        f"{TARGET_SUBSCRIBE_TO_PULL:.2f}), daemon CPU {cpu:.2f} "
        f"({verdict(cpu <= TARGET_SUBSCRIBE_CPU_TO_PULL)}, ≤ {TARGET_SUBSCRIBE_CPU_TO_PULL:.1f})"
    )
