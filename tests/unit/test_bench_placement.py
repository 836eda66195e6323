"""`bench.placement`: the gateway on a CPU of its own, the consumer on the others, and both
back on every CPU afterwards, read back from the kernel for every thread."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from dlrfeed_testing.bench import placement

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="a split needs two CPUs (CI has two)"
)

_THREADED_CHILD = (
    "import threading, time, subprocess, sys\n"
    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "time.sleep(60)\n"
)


def _allowed(pid: int) -> set[int]:
    """The CPUs every thread of `pid` may run on (they must agree)."""
    masks = {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")}
    assert len(masks) == 1, masks
    return set(next(iter(masks)))


@pytest.fixture
def two_processes() -> Iterator[tuple[int, int]]:
    """Two running process trees, each with a second thread and a child of its own."""
    started = [subprocess.Popen([sys.executable, "-c", _THREADED_CHILD]) for _ in range(2)]
    try:
        for process in started:  # wait for the thread and the child to exist
            while len(os.listdir(f"/proc/{process.pid}/task")) < 2 or not placement.children(
                process.pid
            ):
                os.sched_yield()
        yield started[0].pid, started[1].pid
    finally:
        for process in started:
            for child in placement.children(process.pid):
                os.kill(child, 9)
            process.kill()
            process.wait()


def test_gateway_apart_pins_every_thread_then_gives_every_cpu_back(
    two_processes: tuple[int, int],
) -> None:
    gateway, consumer = two_processes
    split = placement.split_cpus()
    assert split is not None
    everything = split.gateway | split.consumer
    assert not split.gateway & split.consumer
    with placement.gateway_apart(split, gateway, consumer):
        assert _allowed(gateway) == split.gateway
        for pid in placement.process_tree(consumer):
            assert _allowed(pid) == split.consumer
        assert len(placement.process_tree(consumer)) == 2
    assert _allowed(gateway) == everything
    for pid in placement.process_tree(consumer):
        assert _allowed(pid) == everything


def test_a_process_started_under_thread_affinity_inherits_it() -> None:
    split = placement.split_cpus()
    assert split is not None
    before = os.sched_getaffinity(0)
    with placement.thread_affinity(split.consumer):
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert os.sched_getaffinity(0) == before
        assert _allowed(process.pid) == split.consumer
    finally:
        process.kill()
        process.wait()
