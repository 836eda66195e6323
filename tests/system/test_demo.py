"""`make run` end to end: scripts/demo.py as a real process tree.

One short unattended run (`--duration`) in a temporary data directory: PostgreSQL, fakegw, the
traffic simulator and `dlrfeed run` start, receipts flow, the ordered stop leaves no process
behind, the summary reports what was stored, and the data directory stays for the next run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlrfeed_tools.metrics import histogram_quantile

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv" / "bin" / "python"


def _command_lines() -> list[str]:
    """The command line of every process on the machine (those readable to us)."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            raw = cmdline.read_bytes()
        except OSError:
            continue  # the process ended while we looked
        if raw:
            lines.append(raw.replace(b"\0", b" ").decode(errors="replace"))
    return lines


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """The demo's data directory, outside pytest's temporary root: every pytest that starts
    resets that root to 0700, which would cut the demo's PostgreSQL off its files."""
    root = Path(tempfile.mkdtemp(prefix="dlrfeed-test-demo-"))
    yield root / "run"
    shutil.rmtree(root, ignore_errors=True)


def test_demo_runs_stops_cleanly_and_summarises(data_dir: Path) -> None:
    """An 8-second demo exits 0, stores receipts by both paths (feed and callback), opens
    exceptions for the anomalies (P12, P14), stops every child (no fakegw/dlrfeed/webhook/
    traffic/postgres left) and keeps its data."""
    python = str(VENV_PYTHON if VENV_PYTHON.exists() else Path(sys.executable))
    proc = subprocess.run(
        [python, "scripts/demo.py", "--duration", "8", "--data-dir", str(data_dir),
         "--rate", "100", "--anomaly-rate", "0.1", "--lying-route-rate", "0.5"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed:\n{out}\n{proc.stderr}"

    gateway = re.search(r"^fakegw\s+(127\.0\.0\.1:\d+)", out, re.M)
    database_url = re.search(r"^postgres\s+(postgresql://\S+)", out, re.M)
    assert gateway is not None, out
    assert database_url is not None, out
    # Not a terminal: plain periodic lines instead of an ANSI redraw.
    assert "\x1b[" not in out
    assert re.search(r"stored=\d", out), out

    assert "Summary" in out
    stored = re.search(r"receptions stored ([\d,]+)", out)
    assert stored is not None, out
    assert int(stored.group(1).replace(",", "")) > 0, out
    exceptions = re.findall(r"^\s{4}(\w+)\s+([\d,]+) / ([\d,]+)$", out, re.M)
    assert sum(int(total.replace(",", "")) for _, _, total in exceptions) >= 1, out
    assert "stopped: traffic exit 0, dlrfeed exit 0, webhook exit 0, fakegw exit 0" in out
    # C6: the route whose DELIVRDs fakegw fakes is named, and it alone.
    assert "lying route: smsc-grey - DELIVRD that no verification backs" in out, out
    # Both paths: receipts by the feed and by HTTP callback (dlr_url) in the one store.
    channels = re.search(r"receptions stored [\d,]+ \(([\d,]+) by feed, ([\d,]+) by webhook\)", out)
    assert channels is not None, out
    assert min(int(n.replace(",", "")) for n in channels.groups()) > 0, out
    shown = re.search(r"dlrfeed show (\S+) --database-url (\S+)", out)
    assert shown is not None, out
    assert shown.group(1) != "MESSAGE_ID"  # a real message of this run
    assert shown.group(2) == database_url.group(1)

    markers = (str(data_dir), gateway.group(1), database_url.group(1))
    leftovers = [line for line in _command_lines() if any(m in line for m in markers)]
    assert leftovers == []

    assert (data_dir / "postgres" / "data" / "PG_VERSION").exists()
    assert not (data_dir / "postgres" / "data" / "postmaster.pid").exists()
    assert (data_dir / "fakegw.sqlite").exists()
    assert {p.name for p in (data_dir / "logs").iterdir()} >= {
        "fakegw.log",
        "dlrfeed.log",
        "webhook.log",
        "traffic.log",
    }


def test_live_view_p99_is_prometheus_histogram_quantile() -> None:
    """The view's receive→ack p99 interpolates within the bucket like histogram_quantile;
    no observations in the window give no figure rather than a stale one."""
    buckets = [(0.01, 0.0), (0.1, 90.0), (1.0, 100.0), (float("inf"), 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.01 + 0.09 * 50 / 90)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.1 + 0.9 * 9 / 10)
    assert histogram_quantile(0.99, [(1.0, 0.0), (float("inf"), 5.0)]) == 1.0  # in +Inf
    assert histogram_quantile(0.99, [(1.0, 0.0), (float("inf"), 0.0)]) is None
