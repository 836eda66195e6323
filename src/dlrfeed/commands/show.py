"""Show one message: computed status, reason, the event behind it, flags, and its full history."""

from __future__ import annotations

import argparse
from typing import Any

from dlrfeed.commands.output import cell, print_json, table
from dlrfeed.config import add_database_url, required
from dlrfeed.domain.parse import stored_id
from dlrfeed.store.reports import JsonDict, connect, message_reports


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """MESSAGE_ID, an optional --login, --json."""
    parser.add_argument("message_id", metavar="MESSAGE_ID", help="the gateway's message id")
    add_database_url(parser)
    parser.add_argument("--login", help="only this login (default: every login with the id)")
    parser.add_argument("--json", action="store_true", help="one JSON document")


async def run(args: argparse.Namespace) -> int:
    """Print the report; exit 1 when nothing at all is known of the id."""
    conn = await connect(required(args, "database_url"), args.database_pooler)
    try:
        # P24: an id kept altered (a NUL, over-long) is found by the id as received, and by
        # the altered form that `exceptions` and `show` print (itself kept altered again if
        # a message was recorded with it: both are shown).
        reports = []
        for message_id in dict.fromkeys((stored_id(args.message_id), args.message_id)):
            reports += await message_reports(conn, message_id, args.login)
    finally:
        await conn.close()
    if args.json:
        print_json({"message_id": args.message_id, "reports": reports})
    elif not reports:
        print(f"nothing known of message id {args.message_id!r}")
    else:
        print("\n\n".join(render(report) for report in reports))
    return 0 if reports else 1


# The status' own flags (docs/rules.md, P19), in words.
_STATUS_FLAGS = {
    "arrival_order_tie": "two progress receipts could not be ordered by reported time: "
    "the first arrived is kept",
    "done_date_implausible": "a reported time was implausible (kept, not used)",
}


def _flags(status: JsonDict, report: JsonDict) -> list[str]:
    flags = []
    if status["repeats"]:
        flags.append(f"repeated deliveries: {status['repeats']}")
    late = sum(1 for r in report["receptions"] if r["outcome"] == "late_progress")
    # Receipts stored before the message was recorded keep their outcome; what the rules made
    # of them on late correlation is in their exception's resolution.
    late += sum(
        1
        for x in report["exceptions"]
        if (x["resolution"] or "").endswith("rules outcome late_progress")
    )
    if late:
        flags.append(f"late progress receipts: {late}")
    if status["conflicts"]:
        flags.append(f"conflicts: {status['conflicts']}")
    if status["deadline_superseded"]:
        flags.append("deadline UNKNOWN superseded (option)")
    flags += [_STATUS_FLAGS.get(flag, flag) for flag in status.get("flags") or ()]
    return flags


def render(report: JsonDict) -> str:
    """One login's report as text: summary first, then history (P20)."""
    lines = [f"message {report['message_id']}   login {report['login']}"]
    lines += _facts(report["facts"])
    message: JsonDict | None = report["message"]
    if message is None:
        lines.append("  sent:      not recorded — receipts are uncorrelated (P12), no status set")
    else:
        lines.append(
            f"  sent:      internal id {cell(message['internal_id'])}, to "
            f"{cell(message['destination'])} (as sent: {cell(message['destination_raw'])}), "
            f"submitted {cell(message['submitted_at'])}, receipts requested "
            f"{cell(message['dlr_requested'])} level {cell(message['dlr_level'])}"
        )
    status: JsonDict | None = report["status"]
    if status is None:
        lines.append("  status:    none computed yet")
    else:
        final = "final" if status["is_final"] else "in progress"
        lines.append(
            f"  status:    {status['status']} ({final}) — as reported by the network, "
            "not seen by a person (P2)"
        )
        lines.append(f"  reason:    {status['reason']}")
        basis = next(
            (e for e in report["events"] if e["id"] == status["supporting_event_id"]), None
        )
        if basis is not None:
            lines.append(
                f"  basis:     event {basis['id']}: level {basis['level']} stat {basis['stat']}"
                f" err {cell(basis['err'])} done {cell(basis['done_at'])}"
            )
        flags = _flags(status, report)
        lines.append("  flags:     " + ("; ".join(flags) if flags else "none"))
        lines.append(f"  updated:   {status['updated_at']} (rules {status['rules_version']})")
    lines.append("\nlogical events (one per id + level, P14):")
    lines.append(table(_EVENT_HEADERS, [_event_row(e) for e in report["events"]]))
    lines.append("\nreceptions (every delivery, in our receive order; reported dates beside, P19):")
    lines.append(table(_RECEPTION_HEADERS, [_reception_row(r) for r in report["receptions"]]))
    lines.append("\nverifications (the sender's own evidence, C6; never changes the status):")
    lines.append(
        table(
            ["verified_at", "kind", "source", "recorded_at"],
            [
                [v["verified_at"], v["kind"], v["source"], v["recorded_at"]]
                for v in report["verifications"]
            ],
        )
    )
    lines.append("\nexceptions:")
    lines.append(table(_EXCEPTION_HEADERS, [_exception_row(x) for x in report["exceptions"]]))
    return "\n".join(lines)


def _facts(facts: JsonDict) -> list[str]:
    """C6: the three facts side by side, each in its own words."""
    accepted = facts["accepted_at_submit"]
    network = facts["reported_by_network"]
    verified = facts["verified"]
    return [
        "  accepted:  "
        + ("not recorded by the sender" if accepted is None else
           f"yes, submitted {cell(accepted['submitted_at'])}"),
        "  network:   "
        + ("no receipt applied" if network is None else
           f"{network['status']} ({'final' if network['is_final'] else 'in progress'})"),
        "  verified:  "
        + ("no verification recorded" if verified is None else
           f"{', '.join(verified['kinds'])} first at {verified['first_at']}"),
    ]  # fmt: skip


_EVENT_HEADERS = [
    "event",
    "level",
    "stat",
    "status",
    "err",
    "done (reported)",
    "received",
    "conflicting",
    "flags",
]


def _event_row(e: JsonDict) -> list[Any]:
    return [
        e["id"],
        e["level"],
        e["stat"],
        e["status"],
        e["err"],
        e["done_at"] or e["done_date_raw"],
        e["times_received"],
        e["conflicting_receptions"],
        ",".join(e["flags"]) or None,
    ]


_EXCEPTION_HEADERS = ["id", "kind", "opened", "resolved", "details"]


def _exception_row(x: JsonDict) -> list[Any]:
    return [x["id"], x["kind"], x["opened_at"], x["resolved_at"], x["details"]]


_RECEPTION_HEADERS = [
    "received_at",
    "level",
    "stat",
    "err",
    "submit (raw)",
    "done (raw)",
    "done (parsed)",
    "delivery",
    "channel",
    "outcome",
]


def _reception_row(r: JsonDict) -> list[Any]:
    return [
        r["received_at"],
        r["level"],
        r["stat"],
        r["err"],
        r["submit_date_raw"],
        r["done_date_raw"],
        r["done_at"],
        r["delivery_count"],
        r["channel"],
        r["outcome"],
    ]
