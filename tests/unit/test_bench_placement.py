"""`bench.placement`: the gateway on a CPU of its own, the consumer on the others, and both
back where they were afterwards, read back from the kernel for every thread."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from dlrfeed_tools.bench import placement

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="a split needs two CPUs (CI has two)"
)

_THREADED_PARENT = (
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


def _started(process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"the helper process exited with {process.returncode}")
    return len(os.listdir(f"/proc/{process.pid}/task")) >= 2 and bool(
        placement.children(process.pid)
    )


@pytest.fixture
def two_processes() -> Iterator[tuple[int, int]]:
    """Two running process trees, each with a second thread and a child of its own."""
    started = [subprocess.Popen([sys.executable, "-c", _THREADED_PARENT]) for _ in range(2)]
    try:
        deadline = time.monotonic() + 30
        while not all(_started(p) for p in started):
            assert time.monotonic() < deadline, "the helper processes did not start in 30 s"
            time.sleep(0.005)
        yield started[0].pid, started[1].pid
    finally:
        for process in started:
            for child in placement.children(process.pid):
                os.kill(child, 9)
            process.kill()
            process.wait()


def test_gateway_apart_pins_every_thread_then_restores_each_process_mask(
    two_processes: tuple[int, int],
) -> None:
    gateway, consumer = two_processes
    split = placement.split_cpus()
    assert split is not None
    assert not split.gateway & split.consumer
    # The consumer starts on the gateway's CPU only, so that "restored" cannot be mistaken for
    # "every CPU".
    placement.pin(placement.process_tree(consumer), split.gateway)
    before = {gateway: _allowed(gateway), consumer: _allowed(consumer)}
    with placement.gateway_apart(split, gateway, consumer):
        assert _allowed(gateway) == split.gateway
        assert len(placement.process_tree(consumer)) == 2
        for pid in placement.process_tree(consumer):
            assert _allowed(pid) == split.consumer
    assert _allowed(gateway) == before[gateway]
    for pid in placement.process_tree(consumer):
        assert _allowed(pid) == before[consumer] == split.gateway


def test_gateway_apart_restores_the_masks_when_the_measurement_fails(
    two_processes: tuple[int, int],
) -> None:
    gateway, consumer = two_processes
    split = placement.split_cpus()
    assert split is not None
    everything = split.gateway | split.consumer
    failed = pytest.raises(RuntimeError, match="measurement failed")
    with failed, placement.gateway_apart(split, gateway, consumer):
        raise RuntimeError("measurement failed")
    assert _allowed(gateway) == everything
    for pid in placement.process_tree(consumer):
        assert _allowed(pid) == everything


def test_a_pin_that_does_not_take_is_an_error() -> None:
    """A CPU this machine does not have: the kernel refuses, and so does `pin`."""
    with pytest.raises(OSError):
        placement.pin([os.getpid()], {max(os.sched_getaffinity(0)) + 4096})


def test_what_starts_under_thread_affinity_inherits_it_and_the_thread_gets_its_mask_back() -> None:
    split = placement.split_cpus()
    assert split is not None
    before = os.sched_getaffinity(0)
    seen: list[set[int]] = []
    with placement.thread_affinity(split.consumer):
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        thread = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        thread.start()
        thread.join()
    try:
        assert os.sched_getaffinity(0) == before
        assert _allowed(process.pid) == split.consumer
        assert seen == [split.consumer]
    finally:
        process.kill()
        process.wait()
    with pytest.raises(RuntimeError, match="inside"), placement.thread_affinity(split.gateway):
        raise RuntimeError("inside")
    assert os.sched_getaffinity(0) == before
