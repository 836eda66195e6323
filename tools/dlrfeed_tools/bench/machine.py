"""What a benchmark's figures were measured on: CPU, kernel, Python, PostgreSQL and the
packages whose speed they depend on, and the load average at the start."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import grpc

from dlrfeed_tools.pgcluster import server_bindir


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    postgres = subprocess.run(
        [str(server_bindir() / "postgres"), "--version"], capture_output=True, text=True
    ).stdout.strip()
    versions = {}
    for package in ("grpcio", "protobuf", "asyncpg", "uvloop"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[package] = version(package)
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "postgres": postgres,
        "grpcio": grpc.__version__,
        "packages": versions,
        "kernel": platform.release(),
        "load_at_start": os.getloadavg(),
    }
