"""The gateway on a CPU of its own: an end-to-end measurement with the gateway's work kept off
the consumer's CPUs, as it is in production.

In production the gateway runs on its provider's hosts; here fakegw shares this machine's CPUs
with the daemon and PostgreSQL, so whatever fakegw spends per receipt is taken from the
consumer. On Subscribe that is one write and one completion per stream message (~20 µs),
against a few µs per receipt of a Pull response, which makes a co-located measurement compare
two gateways as much as two readers. `gateway_apart` pins fakegw to the first CPU and
PostgreSQL to the others for the length of one measurement; the daemon, started inside it with
`thread_affinity(consumer_cpus)`, inherits the consumer's CPUs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Set
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuSplit:
    """Which CPUs the gateway gets and which the consumer (daemon and PostgreSQL) gets."""

    gateway: frozenset[int]
    consumer: frozenset[int]


def split_cpus() -> CpuSplit | None:
    """The first CPU this thread may use for the gateway, the rest for the consumer; None on
    a machine with one CPU, where there is nothing to split."""
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        return None
    return CpuSplit(gateway=frozenset(usable[:1]), consumer=frozenset(usable[1:]))


def children(pid: int) -> list[int]:
    """The pids of the processes that `pid`'s main thread has started and not yet reaped (all
    of them for the processes measured here, which fork from their main thread)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (PostgreSQL: the postmaster and its backends)."""
    return [pid, *(p for child in children(pid) for p in process_tree(child))]


def pin(pids: list[int], cpus: Set[int]) -> None:
    """Every thread of these processes onto `cpus`, checked by reading each mask back. A
    thread or process that ends meanwhile is skipped; the ones created later inherit the mask
    of the thread that creates them. Anything else (no permission, a CPU outside the cgroup's
    set) raises: a measurement must not be reported as placed when it was not."""
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for task in map(int, os.listdir(f"/proc/{pid}/task")):
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(task, cpus)
                    if os.sched_getaffinity(task) != cpus:
                        raise RuntimeError(f"thread {task} of {pid} did not move to CPUs {cpus}")


@contextlib.contextmanager
def thread_affinity(cpus: Set[int]) -> Iterator[None]:
    """The calling thread on `cpus` while inside (a process it starts inherits the mask)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def gateway_apart(split: CpuSplit, fakegw_pid: int, postmaster_pid: int) -> Iterator[None]:
    """fakegw on the gateway's CPUs and PostgreSQL on the consumer's while inside; afterwards
    every thread of both, including those started meanwhile, back on the CPUs its process had
    before."""
    before = {pid: os.sched_getaffinity(pid) for pid in (fakegw_pid, postmaster_pid)}
    try:
        pin([fakegw_pid], split.gateway)
        pin(process_tree(postmaster_pid), split.consumer)
        yield
    finally:
        pin([fakegw_pid], before[fakegw_pid])
        pin(process_tree(postmaster_pid), before[postmaster_pid])
