"""F2 (what is enqueued) and F3 (deadline UNKNOWN) through fakegw's simulated sending."""

from __future__ import annotations

from fakegw.admin_client import AdminClient
from fakegw.server import FakeGateway
from support.callback_receiver import CallbackReceiver
from support.fakegw_support import LOGIN, LOGINS, OTHER_LOGIN, PASSWORD, feed_client, wait_until


def _progress(message_id: str) -> dict[str, object]:
    return {"id": message_id, "level": 1, "stat": "ENROUTE"}


def _result(message_id: str) -> dict[str, object]:
    return {"id": message_id, "level": 2, "stat": "DELIVRD", "err": "000"}


async def test_f2_only_feed_eligible_receipts_are_enqueued() -> None:
    """Webhook wins, SMPP never, dlr off never, and only requested levels reach the feed."""
    async with CallbackReceiver() as receiver:
        messages = [
            {"id": "grpc-both", "dlr": True, "dlr_level": 3, "channel": "grpc"},
            {"id": "rest-result", "dlr": "yes", "dlr_level": 2, "channel": "rest"},
            {"id": "grpc-progress", "dlr": True, "dlr_level": 1, "channel": "grpc"},
            {"id": "webhook", "dlr": True, "dlr_level": 3, "dlr_url": receiver.url()},
            {"id": "smpp", "dlr": True, "dlr_level": 3, "channel": "smpp"},
            {"id": "no-dlr", "dlr": False, "dlr_level": 3, "channel": "grpc"},
            {"id": "rest-no", "dlr": "no", "dlr_level": 3, "channel": "rest"},
        ]
        async with FakeGateway(LOGINS).running() as gw:
            async with AdminClient(gw.target, LOGIN, PASSWORD) as admin:
                assert (await admin.send(messages))["registered"] == len(messages)
                reports = [f(str(m["id"])) for m in messages for f in (_progress, _result)]
                reports.append(_result("never-sent"))
                result = await admin.report(reports)
            # F2: the webhook's two receipts go to its dlr_url (test_fakegw_callbacks.py).
            assert result == {
                "enqueued": 4,
                "callbacks": 2,
                "filtered": 8,
                "unknown_message": 1,
                "dropped_at_cap": 0,
            }
            client = feed_client(gw.target)
            receipts = await client.pull()
            await client.close()
            assert sorted((r.id, r.level) for r in receipts) == [
                ("grpc-both", 1),
                ("grpc-both", 2),
                ("grpc-progress", 1),
                ("rest-result", 2),
            ]
            # Receipts are per login: the other login's feed got nothing.
            assert gw.stats(OTHER_LOGIN)["total"] == 0


async def test_f3_message_without_result_by_the_deadline_gets_a_final_unknown() -> None:
    async with (
        CallbackReceiver() as receiver,
        # A deadline no stall between the send and the report below outlasts.
        FakeGateway(LOGINS, dlr_deadline_seconds=3, housekeeping_seconds=0.05).running() as gw,
    ):
        await gw.send(
            LOGIN,
            [
                {"id": "silent", "dlr": True, "dlr_level": 3},
                {"id": "answered", "dlr": True, "dlr_level": 3},
                {"id": "progress-only", "dlr": True, "dlr_level": 1},
                {"id": "webhook", "dlr": True, "dlr_level": 3, "dlr_url": receiver.url()},
            ],
        )
        await gw.report(LOGIN, [_result("answered")])
        await wait_until(lambda: gw.stats(LOGIN)["deadline_unknown"] == 1)
        client = feed_client(gw.target)
        receipts = await client.pull()
        await client.close()
        by_id = {r.id: r for r in receipts}
        assert sorted(by_id) == ["answered", "silent"]
        unknown = by_id["silent"]
        assert (unknown.level, unknown.stat) == (2, "UNKNOWN")
        assert unknown.HasField("done_date")
        assert not unknown.HasField("err")
        assert by_id["answered"].stat == "DELIVRD"
        assert gw.stats(LOGIN)["deadline_unknown"] == 1
