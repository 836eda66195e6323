"""py-spy's raw (collapsed) samples summarised per component of the daemon's stack."""

from __future__ import annotations

from collections import Counter
from typing import Any

_CATEGORIES = (
    ("gRPC (grpcio's aio and cygrpc)", ("grpc/", "cygrpc", "grpc_")),
    ("protobuf", ("google/protobuf", "_pb2")),
    ("asyncpg", ("asyncpg/",)),
    ("store (dlrfeed.store)", ("dlrfeed/store/",)),
    ("domain parse/rules (dlrfeed.domain)", ("dlrfeed/domain/",)),
    ("feed client/reader/acker (dlrfeed.feed)", ("dlrfeed/feed/",)),
    ("daemon batcher/metrics (dlrfeed.daemon)", ("dlrfeed/daemon/",)),
    ("structlog / logging", ("structlog/", "logging/")),
    ("event loop (uvloop C code and its I/O, asyncio)", ("uvloop", "asyncio/")),
)


def _frame_category(frame: str) -> str:
    for name, needles in _CATEGORIES:
        if any(needle in frame for needle in needles):
            return name
    return "other (stdlib, interpreter)"


def summarise_profile(raw: str) -> dict[str, Any]:
    """Top self frames and time per component from py-spy's raw (collapsed) output.

    Each raw line is `frame;frame;...;leaf COUNT`. A sample is charged to the component of its
    innermost frame that belongs to a known component (so a json.dumps called by the store is
    charged to the store's caller chain only when json is not itself listed).
    """
    self_counts: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        self_counts[frames[-1]] += count
        category = "other (stdlib, interpreter)"
        for frame in reversed(frames):
            found = _frame_category(frame)
            if found != "other (stdlib, interpreter)":
                category = found
                break
        categories[category] += count
        for frame in set(frames):
            if "dlrfeed/" in frame and "dlrfeed/cli.py" not in frame:
                inclusive[frame] += count
    if not total:
        return {"samples": 0, "self": [], "categories": [], "inclusive": []}

    def share(counter: Counter[str], top: int) -> list[tuple[str, float]]:
        return [(frame, 100 * n / total) for frame, n in counter.most_common(top)]

    return {
        "samples": total,
        "self": share(self_counts, 12),
        "categories": share(categories, len(_CATEGORIES) + 1),
        "inclusive": share(inclusive, 12),
    }
