"""Small readings of `bench.run`'s results shared by the report's sections: a rate with its
spread, a verdict, a configuration's mode, CPU per receipt, a profile's share."""

from __future__ import annotations

import statistics
from typing import Any

HAND_WRITTEN_HEADING = "## Measured by hand"
"""The report's last section, written by hand (candidates measured A/B outside `make bench`):
`make bench` keeps it as it finds it."""


def rate_text(figure: dict[str, float]) -> str:
    """A median rate with its min-max beside it."""
    return f"{figure['median']:,.0f} ({figure['min']:,.0f}-{figure['max']:,.0f})"


def rate_ratios(measured: dict[str, Any], name: str, other: str) -> list[float]:
    """`name`'s end-to-end rate over `other`'s within each repetition: both are measured in
    every repetition, minutes apart at most, so drift slower than that leaves each ratio."""
    mine: list[float] = measured[name]["e2e"]["runs"]
    theirs: list[float] = measured[other]["e2e"]["runs"]
    return [a / b for a, b in zip(mine, theirs, strict=True)]


def rate_ratio(measured: dict[str, Any], name: str, other: str) -> float:
    """The median of `rate_ratios`: the figure a rate against another's is judged by."""
    return statistics.median(rate_ratios(measured, name, other))


def ratio_text(ratios: list[float]) -> str:
    """The median of `rate_ratios` with their min-max beside it."""
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def verdict(met: bool) -> str:
    """How a figure stands against its target, as the report prints it."""
    return "met" if met else "**not met**"


def configuration_mode(name: str) -> str:
    """`subscribe` of "subscribe 1x2": the --mode of a configuration's name."""
    return name.split(" ", 1)[0]


def configuration_shape(name: str) -> str:
    """`1x2` of "subscribe 1x2": processes x streams of a configuration's name."""
    return name.split(" ", 1)[1]


def pull_of(name: str) -> str:
    """ "pull 1x2" for "subscribe 1x2": the Pull configuration of the same shape."""
    return f"pull {configuration_shape(name)}"


def cpu_total(figures: dict[str, float]) -> float:
    """µs of CPU per receipt over every process of a measurement."""
    return sum(v for k, v in figures.items() if k != "cores_busy")


def daemon_cpu(results: dict[str, Any], name: str) -> float | None:
    """µs of CPU per receipt of the `dlrfeed run` process(es) of configuration `name`."""
    figures = results.get("cpu_us_per_receipt", {}).get(name, {}).get("e2e", {})
    value = figures.get("daemon")
    return None if value is None else float(value)


def share(results: dict[str, Any], mode: str, category_start: str) -> float:
    """Percent of the `mode` profile's samples charged to the component named so."""
    for profile in results.get("profiles", []):
        if profile["mode"] == mode:
            categories: list[tuple[str, float]] = profile.get("categories", [])
            return sum(pct for name, pct in categories if name.startswith(category_start))
    return 0.0
