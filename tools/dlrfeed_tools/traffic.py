"""Traffic simulator for the local demo: plays the sending application against a running fakegw.

Every second it takes the next messages from fakegw's seeded generator
(`fakegw.traffic.scenario`: a realistic status mix of ~90 % DELIVRD, some UNDELIV/EXPIRED/REJECTD,
plus the content faults), records them through `dlrfeed record-submissions -` (the sender's
side, P10), registers them with the gateway (admin `Send`) and then hands their receipts to the
gateway (admin `Report`, so F2 filters what the login did not ask for) spread out over time the
way a network answers: progress after a fraction of a second, the result seconds later. On top
of the generator's anomalies it adds the ones only time can make:

- late progress: a progress receipt seconds after the result (P16);
- late submissions: the sender records some messages only after their receipts have arrived
  (the receipts are uncorrelated first, then correlated late — P12);
- withheld results: no result is ever reported, so the gateway's deadline produces a final
  `UNKNOWN` (F3; needs `fakegw serve --dlr-deadline-seconds` shorter than the run);
- result-only messages (`dlr_level` 2): the gateway drops their progress receipts (F2);
- unknown ids go through admin `Inject`, since `Report` only takes ids the gateway sent;
- a lying route (`fakegw.traffic.LYING_ROUTE`, `--lying-route-rate`): fake DELIVRDs at submit
  time for messages that never arrive. The sender's own evidence tells: the messages that
  really arrived are verified (`--verify-rate` of them: an OTP code entered seconds after
  delivery), recorded with `dlrfeed record-verifications -`; those of the lying route never are.

It prints one JSON line of running totals per second and stops on SIGTERM/SIGINT (exit 0),
after handing over everything still scheduled (see `Simulator.drain`).
fakegw and dlrfeed never import each other; this script uses fakegw's admin client and runs the
`dlrfeed` command.

    python scripts/traffic.py --target 127.0.0.1:50051 --login demo \\
        --database-url postgresql://postgres@127.0.0.1:5432/postgres [--rate 200]
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fakegw.admin_client import SyncAdminClient
from fakegw.traffic import LYING_ROUTE, Scenario, TrafficMix, scenario

_TICK_SECONDS = 0.1  # how often due receipts are handed to the gateway
_SUBMIT_EVERY_SECONDS = 1.0  # one `dlrfeed record-submissions` process per second at most
_MAX_MESSAGES_PER_STEP = 5000  # catching up after a stall never makes one giant batch


@dataclass(frozen=True)
class LifecycleTiming:
    """Delays, in seconds after sending, of what the network reports."""

    progress: tuple[float, float] = (0.2, 1.5)
    result: tuple[float, float] = (1.0, 6.0)
    repeat: tuple[float, float] = (0.3, 3.0)  # a duplicate or a conflicting second final
    late_progress: tuple[float, float] = (5.0, 15.0)
    late_submission: tuple[float, float] = (3.0, 10.0)  # after the message's last receipt
    verification: tuple[float, float] = (2.0, 8.0)  # after the message's last receipt


@dataclass(order=True)
class _Due:
    """One scheduled action: a receipt to report or inject, or a late submission to record."""

    at: float
    seq: int
    kind: str = field(compare=False)  # "report" | "inject" | "submission" | "verification"
    body: dict[str, Any] = field(compare=False)


@dataclass
class Totals:
    """Running totals printed once a second (and at the end)."""

    messages: int = 0
    submissions_recorded: int = 0
    late_submissions: int = 0
    receipts_reported: int = 0
    receipts_enqueued: int = 0
    filtered_by_f2: int = 0
    unknown_ids_injected: int = 0
    late_progress: int = 0
    withheld_results: int = 0
    result_only_messages: int = 0
    callback_messages: int = 0
    lying_route_messages: int = 0
    verifications_recorded: int = 0
    record_failures: int = 0

    def as_json(self, pending: int) -> str:
        return json.dumps({"event": "traffic", **self.__dict__, "pending": pending})


class Simulator:
    """Schedules message lifecycles and plays them against the gateway and the store."""

    def __init__(self, args: argparse.Namespace, admin: SyncAdminClient) -> None:
        self.args = args
        self.admin = admin
        self.rng = random.Random(args.seed)
        self.timing = LifecycleTiming(result=(args.result_delay_min, args.result_delay_max))
        a = args.anomaly_rate
        # The generator's per-message content faults, scaled by one knob (see --anomaly-rate).
        self.mix = TrafficMix(
            progress_rate=args.progress_rate,
            duplicate_rate=a,
            result_before_progress_rate=a / 2,
            conflicting_final_rate=a / 4,
            unknown_id_rate=a / 4,
            malformed_rate=a / 4,
            lying_route_rate=args.lying_route_rate,
        )
        self.late_submission_rate = (
            a / 2 if args.late_submission_rate is None else args.late_submission_rate
        )
        self.due: list[_Due] = []
        self.seq = 0
        self.generated = 0
        self.totals = Totals()

    def _schedule(self, at: float, kind: str, body: dict[str, Any]) -> None:
        self.seq += 1
        heapq.heappush(self.due, _Due(at, self.seq, kind, body))

    def new_messages(self, count: int) -> Scenario:
        """The next `count` messages of the seeded generator, with dlr_level varied (F2)."""
        batch = scenario(self.args.seed, count, self.mix, self.generated)
        self.generated += count
        for message in batch.messages:
            if message["route"] == LYING_ROUTE:
                self.totals.lying_route_messages += 1
            if self.rng.random() < self.args.result_only_rate:
                message["dlr_level"] = 2  # F2: the gateway will drop its progress receipts
                self.totals.result_only_messages += 1
            if self.args.webhook_url and self.rng.random() < self.args.webhook_rate:
                message["dlr_url"] = self.args.webhook_url  # F2: its receipts are POSTed there
                self.totals.callback_messages += 1
        return batch

    def plan(self, batch: Scenario, sent: float, late_ids: set[str]) -> None:
        """Give every receipt of the batch a time, withhold some results, and schedule the late
        submissions after their message's last receipt."""
        known = {m["id"] for m in batch.messages}
        by_message: dict[str, list[dict[str, Any]]] = {m["id"]: [] for m in batch.messages}
        owner = ""
        unknown: list[tuple[str, dict[str, Any]]] = []
        for receipt in batch.receipts:
            if receipt["id"] in known:
                owner = receipt["id"]
                by_message[owner].append(receipt)
            else:
                unknown.append((owner, receipt))  # an id nobody sent, after its neighbour
        last_at: dict[str, float] = {}
        for message_id, receipts in by_message.items():
            if self.rng.random() < self.args.withheld_result_rate:
                # F3: no result ever comes; the gateway's deadline reports UNKNOWN.
                receipts = [r for r in receipts if r.get("level") != 2]
                self.totals.withheld_results += 1
            last_at[message_id] = self._plan_lifecycle(receipts, sent)
        for owner_id, receipt in unknown:
            at = last_at.get(owner_id, sent) + self._between(self.timing.repeat)
            self._schedule(at, "inject", receipt)
        for verification in batch.verifications(self.rng, self.args.verify_rate):
            # The person enters the code seconds after the message arrived (C6).
            at = last_at[verification["message_id"]] + self._between(self.timing.verification)
            self._schedule(at, "verification", verification)
        for submission in batch.submissions():
            if submission["message_id"] in late_ids:
                # P12: its receipts arrive uncorrelated; recording it correlates them late.
                at = last_at[submission["message_id"]] + self._between(self.timing.late_submission)
                self._schedule(at, "submission", submission)

    def _plan_lifecycle(self, receipts: list[dict[str, Any]], sent: float) -> float:
        """Times in list order: progress, then the result, then whatever came after it."""
        at = sent
        result_seen = False
        for receipt in receipts:
            if receipt.get("level") == 2 and not result_seen:
                at = max(at, sent + self._between(self.timing.result))
                result_seen = True
            elif not result_seen:
                at = max(at, sent + self._between(self.timing.progress))
            elif receipt.get("level") == 1 and self.rng.random() < 0.5:
                at += self._between(self.timing.late_progress)  # P16: progress after the result
                self.totals.late_progress += 1
            else:
                at += self._between(self.timing.repeat)
            self._schedule(at, "report", receipt)
        return at

    def _between(self, bounds: tuple[float, float]) -> float:
        return self.rng.uniform(*bounds)

    def start_step(self, now: float, count: int, pool: ThreadPoolExecutor) -> _Recording:
        """Take this step's new messages and the late submissions now due, and start recording
        them in the background (receipts keep flowing meanwhile)."""
        batch = self.new_messages(count) if count else Scenario()
        late_ids = {
            m["id"] for m in batch.messages if self.rng.random() < self.late_submission_rate
        }
        self.totals.late_submissions += len(late_ids)
        due_late = [d.body for d in self.pop_due(now, kinds={"submission"})]
        on_time = [s for s in batch.submissions() if s["message_id"] not in late_ids]
        submissions = on_time + due_late
        future = pool.submit(record_submissions, self.args, submissions)
        verified = [d.body for d in self.pop_due(now, kinds={"verification"})]
        verifying = pool.submit(record_verifications, self.args, verified)
        return _Recording(future, len(submissions), batch, late_ids, verifying, len(verified))

    def finish_step(self, recording: _Recording) -> None:
        """Count the recording, then send its messages and plan their receipts: a sender
        records a message before it can get receipts for it (P10)."""
        error = recording.future.result()
        if error is None:
            self.totals.submissions_recorded += recording.count
        else:
            # The sender's store being briefly unavailable must not stop the traffic.
            self.totals.record_failures += recording.count
            print(json.dumps({"event": "record_failed", "error": error}), flush=True)
        error = recording.verifying.result()
        if error is None:
            self.totals.verifications_recorded += recording.verified
        else:
            self.totals.record_failures += recording.verified
            print(json.dumps({"event": "record_failed", "error": error}), flush=True)
        if recording.batch.messages:
            self.admin.send(recording.batch.messages)
            self.totals.messages += len(recording.batch.messages)
            self.plan(recording.batch, time.monotonic(), recording.late_ids)

    def pop_due(self, now: float, kinds: set[str]) -> list[_Due]:
        """Remove and return the scheduled actions of `kinds` due by `now` (others stay)."""
        taken: list[_Due] = []
        kept: list[_Due] = []
        while self.due and self.due[0].at <= now:
            item = heapq.heappop(self.due)
            (taken if item.kind in kinds else kept).append(item)
        for item in kept:
            heapq.heappush(self.due, item)
        return taken

    def flush_receipts(self, now: float) -> None:
        """Hand every due receipt to the gateway: sent ids through Report, others through Inject."""
        due = self.pop_due(now, kinds={"report", "inject"})
        reports = [d.body for d in due if d.kind == "report"]
        injects = [d.body for d in due if d.kind == "inject"]
        if reports:
            result = self.admin.report(reports)
            self.totals.receipts_reported += len(reports)
            self.totals.receipts_enqueued += result["enqueued"]
            self.totals.filtered_by_f2 += result["filtered"]
        if injects:
            result = self.admin.inject(injects)
            self.totals.unknown_ids_injected += len(injects)
            self.totals.receipts_enqueued += result["enqueued"]

    def drain(self) -> None:
        """On stop, the network "catches up": every scheduled receipt is handed over now (the
        gateway keeps them durably for the next run) and the late submissions are recorded,
        so a stop leaves no message without its result to turn into a deadline UNKNOWN."""
        self.flush_receipts(float("inf"))
        late = [d.body for d in self.pop_due(float("inf"), kinds={"submission"})]
        if record_submissions(self.args, late) is None:
            self.totals.submissions_recorded += len(late)
        else:
            self.totals.record_failures += len(late)
        verified = [d.body for d in self.pop_due(float("inf"), kinds={"verification"})]
        if record_verifications(self.args, verified) is None:
            self.totals.verifications_recorded += len(verified)
        else:
            self.totals.record_failures += len(verified)


@dataclass
class _Recording:
    """A `dlrfeed record-submissions` run in progress and the messages waiting for it."""

    future: Future[str | None]
    count: int
    batch: Scenario
    late_ids: set[str]
    verifying: Future[str | None]
    verified: int


def record_submissions(args: argparse.Namespace, submissions: list[dict[str, Any]]) -> str | None:
    """`dlrfeed record-submissions -` with the lines on stdin, as a sender would run it;
    None on success, else its error output."""
    return _record(args, "record-submissions", submissions)


def record_verifications(args: argparse.Namespace, lines: list[dict[str, Any]]) -> str | None:
    """`dlrfeed record-verifications -` with the lines on stdin: the sender's evidence (C6)."""
    return _record(args, "record-verifications", lines)


def _record(args: argparse.Namespace, command: str, lines: list[dict[str, Any]]) -> str | None:
    if not lines:
        return None
    payload = "".join(json.dumps(line) + "\n" for line in lines)
    proc = subprocess.run(
        [args.dlrfeed, command, "-", "--login", args.login, "--database-url", args.database_url],
        input=payload, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")


def run(args: argparse.Namespace) -> int:
    """Play traffic until SIGTERM/SIGINT or `--duration`; one JSON totals line per second."""
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with (
        SyncAdminClient(args.target, args.login, args.password) as admin,
        ThreadPoolExecutor(1, thread_name_prefix="record") as pool,
    ):
        simulator = Simulator(args, admin)
        started = time.monotonic()
        next_submit = started
        next_print = started + 1.0
        recording: _Recording | None = None
        while not stopping:
            now = time.monotonic()
            if args.duration and now - started >= args.duration:
                break
            if recording is None and now >= next_submit:
                # Messages owed at --rate since the start, in one step (bounded).
                owed = int(args.rate * (now - started)) + 1 - simulator.generated
                count = max(0, min(owed, _MAX_MESSAGES_PER_STEP))
                recording = simulator.start_step(now, count, pool)
                next_submit = now + _SUBMIT_EVERY_SECONDS
            if recording is not None and recording.future.done():
                simulator.finish_step(recording)
                recording = None
            simulator.flush_receipts(time.monotonic())
            if now >= next_print:
                print(simulator.totals.as_json(len(simulator.due)), flush=True)
                next_print = now + 1.0
            time.sleep(_TICK_SECONDS)
        if recording is not None:
            simulator.finish_step(recording)  # waits for the recording in hand
        simulator.drain()
        print(simulator.totals.as_json(len(simulator.due)), flush=True)
    return 0


def _dlrfeed_command() -> str:
    """The `dlrfeed` console script beside this interpreter (the project's venv), else PATH."""
    beside = Path(sys.executable).with_name("dlrfeed")
    return str(beside) if beside.exists() else "dlrfeed"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The simulator's options; every rate is a probability per message."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="fakegw HOST:PORT")
    parser.add_argument("--login", required=True, help="the gateway login to send as")
    parser.add_argument(
        "--password",
        default=os.environ.get("FAKEGW_PASSWORD"),
        help="or env FAKEGW_PASSWORD; without one the login is named (loopback only)",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DLRFEED_DATABASE_URL"),
        required="DLRFEED_DATABASE_URL" not in os.environ,
        help="where `dlrfeed record-submissions` records the sent messages",
    )
    parser.add_argument("--dlrfeed", default=_dlrfeed_command(), help="the dlrfeed command")
    parser.add_argument("--rate", type=float, default=200.0, help="messages sent per second")
    parser.add_argument("--duration", type=float, default=0.0, help="seconds (0 = until SIGTERM)")
    parser.add_argument(
        "--seed", type=int, default=None, help="random seed (default: the clock, new ids per run)"
    )
    parser.add_argument(
        "--anomaly-rate",
        type=float,
        default=0.04,
        help="scales every content anomaly: duplicates = A, result before progress = A/2 "
        "(half of them late progress), conflicting finals, unknown ids, malformed dates or "
        "stat = A/4 each, late submissions = A/2",
    )
    parser.add_argument(
        "--late-submission-rate", type=float, default=None, help="override A/2 (P12)"
    )
    parser.add_argument(
        "--withheld-result-rate",
        type=float,
        default=0.01,
        help="messages whose result never comes: the gateway's deadline says UNKNOWN (F3)",
    )
    parser.add_argument(
        "--result-only-rate",
        type=float,
        default=0.1,
        help="messages sent with dlr_level 2: their progress receipts are filtered (F2)",
    )
    parser.add_argument(
        "--progress-rate", type=float, default=0.8, help="messages that get a progress receipt"
    )
    parser.add_argument(
        "--webhook-url",
        help="messages sent with this dlr_url get their receipts POSTed there, not in the feed",
    )
    parser.add_argument(
        "--webhook-rate",
        type=float,
        default=0.2,
        help="with --webhook-url: the messages sent with it (F2: the webhook wins)",
    )
    parser.add_argument(
        "--lying-route-rate",
        type=float,
        default=0.1,
        help=f"messages sent through {LYING_ROUTE}, whose DELIVRDs are fake (never delivered, "
        "done date = submit date)",
    )
    parser.add_argument(
        "--verify-rate",
        type=float,
        default=0.85,
        help="of the messages that really arrived, those whose OTP code is entered (recorded "
        "with dlrfeed record-verifications)",
    )
    parser.add_argument("--result-delay-min", type=float, default=1.0, help="seconds")
    parser.add_argument("--result-delay-max", type=float, default=6.0, help="seconds")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = int(time.time() * 1000) % 2**31  # fresh message ids on every run
    return args


if __name__ == "__main__":
    sys.exit(run(parse_args()))
