"""A small SMSC on loopback that speaks SMPP v3.4 to a real ESME (Kannel's `smsc = smpp`).

It takes binds (transmitter, receiver, transceiver) with one system id and password, answers
every `submit_sm` as `answer` decides — a `submit_sm_resp` with its message id, or an error
status — and, for an accepted submit with a receipt planned, sends a `deliver_sm` delivery
receipt in SMPP v3.4 Appendix B form (`id:... sub:... dlvrd:... submit date:... done date:...
stat:... err:... text:...`), with the `receipted_message_id` and `message_state` TLVs a v3.4
SMSC adds. It answers `enquire_link` and `unbind`, and `generic_nack` for anything else.

The codec is the dozen fields these PDUs need, written out: the SMPP libraries on PyPI are ESME
clients (smpplib draws sequence numbers from a client object and is untyped), and the SMSC side
of a test is easier to read, and to trust, as bytes. The sections cited (§) are of
the SMPP v3.4 specification, edition 1.2 (1999).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

# Command ids (SMPP v3.4 §5.1.2.1); a response is its request's id with the top bit set.
BIND_RECEIVER = 0x00000001
BIND_TRANSMITTER = 0x00000002
SUBMIT_SM = 0x00000004
DELIVER_SM = 0x00000005
UNBIND = 0x00000006
BIND_TRANSCEIVER = 0x00000009
ENQUIRE_LINK = 0x00000015
GENERIC_NACK = 0x80000000
RESPONSE = 0x80000000

# Command statuses (§5.1.3) the simulator uses.
ESME_ROK = 0x00000000
ESME_RINVCMDID = 0x00000003
ESME_RINVDSTADR = 0x0000000B
ESME_RBINDFAIL = 0x0000000D

# Message states of the message_state TLV (§5.2.28) by the receipt's stat.
_MESSAGE_STATES = {
    "ENROUTE": 1,
    "DELIVRD": 2,
    "EXPIRED": 3,
    "DELETED": 4,
    "UNDELIV": 5,
    "ACCEPTD": 6,
    "UNKNOWN": 7,
    "REJECTD": 8,
}
_TLV_RECEIPTED_MESSAGE_ID = 0x001E
_TLV_MESSAGE_STATE = 0x0427
_ESM_CLASS_RECEIPT = 0x04  # §5.2.12: "SMSC Delivery Receipt"
_HEADER = struct.Struct(">IIII")


@dataclass(frozen=True, slots=True)
class Submit:
    """One `submit_sm` as the ESME sent it."""

    source_addr: str
    destination_addr: str
    registered_delivery: int
    data_coding: int
    short_message: bytes


@dataclass(frozen=True, slots=True)
class Receipt:
    """The delivery receipt the handset's network returns for an accepted submit."""

    stat: str
    err: str = "000"
    text: bytes = b""
    """The receipt's `text:` field, raw bytes (the first 20 of the message by convention)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What the SMSC does with one submit: refuse it with `status`, or accept it and then
    return `receipt` (none: no receipt ever comes)."""

    status: int = ESME_ROK
    receipt: Receipt | None = None


@dataclass(eq=False, slots=True)  # one per connection: hashed by identity
class _Link:
    """One bound connection."""

    writer: asyncio.StreamWriter
    receives: bool
    sequence: int = 0

    def send(self, command_id: int, status: int, sequence: int, body: bytes = b"") -> None:
        self.writer.write(_HEADER.pack(16 + len(body), command_id, status, sequence) + body)

    def next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence


@dataclass
class SmscSimulator:
    """The SMSC: `async with simulator.serving():` listens on a free loopback port (`port`)."""

    answer: Callable[[Submit], Answer]
    system_id: str = "kannel"
    password: str = "smpp-pw"
    receipt_delay: float = 0.0
    """Seconds between accepting a submit and sending its receipt: 0 sends it at once (Kannel
    stores the id before it reads on); a real network takes seconds, and Jasmin relies on that
    (it maps the SMSC's id to its own in Redis after the submit_sm_resp, asynchronously)."""
    port: int = 0
    submits: list[tuple[str, Submit]] = field(default_factory=list)
    """(message id given, submit), in arrival order; the id is "" for a refused submit."""
    receipts_answered: int = 0
    """`deliver_sm_resp`s received: receipts the ESME has taken."""
    binds: list[int] = field(default_factory=list)
    """The command id of every successful bind."""
    receipts: dict[str, bytes] = field(default_factory=dict)
    """message id → the receipt's short_message as sent (Appendix B text)."""
    _receipts: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)
    _links: set[_Link] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[SmscSimulator]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(server.sockets[0].getsockname()[1])
        try:
            async with server:
                yield self
        finally:
            server.close()
            for link in self._links:
                link.writer.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer, receives=False)
        sender: asyncio.Task[None] | None = None
        try:
            while True:
                try:
                    header = await reader.readexactly(16)
                except asyncio.IncompleteReadError:
                    return
                length, command_id, _status, sequence = _HEADER.unpack(header)
                body = await reader.readexactly(length - 16)
                if command_id in (BIND_RECEIVER, BIND_TRANSMITTER, BIND_TRANSCEIVER):
                    if self._bind(link, command_id, sequence, body) and link.receives:
                        sender = asyncio.create_task(self._send_receipts(link), name="smsc-dlr")
                        self._tasks.add(sender)
                elif command_id == SUBMIT_SM:
                    self._submit(link, sequence, body)
                elif command_id == ENQUIRE_LINK:
                    link.send(ENQUIRE_LINK | RESPONSE, ESME_ROK, sequence)
                elif command_id == DELIVER_SM | RESPONSE:
                    self.receipts_answered += 1
                elif command_id == UNBIND:
                    link.send(UNBIND | RESPONSE, ESME_ROK, sequence)
                    await writer.drain()
                    return
                elif not command_id & RESPONSE:
                    link.send(GENERIC_NACK, ESME_RINVCMDID, sequence)
                await writer.drain()
        except ConnectionError:
            return
        finally:
            self._links.discard(link)
            if sender is not None:
                sender.cancel()
            writer.close()

    def _bind(self, link: _Link, command_id: int, sequence: int, body: bytes) -> bool:
        system_id, at = _c_octets(body, 0)
        password, at = _c_octets(body, at)
        granted = (system_id, password) == (self.system_id, self.password)
        reply = _c_octet(self.system_id) if granted else b""
        link.send(command_id | RESPONSE, ESME_ROK if granted else ESME_RBINDFAIL, sequence, reply)
        if granted:
            link.receives = command_id != BIND_TRANSMITTER
            self._links.add(link)
            self.binds.append(command_id)
        return granted

    def _submit(self, link: _Link, sequence: int, body: bytes) -> None:
        submit = _read_submit(body)
        answer = self.answer(submit)
        if answer.status != ESME_ROK:
            self.submits.append(("", submit))
            link.send(SUBMIT_SM | RESPONSE, answer.status, sequence)
            return
        message_id = f"{0x5E000000 + len(self.submits):x}"
        self.submits.append((message_id, submit))
        link.send(SUBMIT_SM | RESPONSE, ESME_ROK, sequence, _c_octet(message_id))
        if answer.receipt is not None:
            # Queued after the submit_sm_resp is written: the ESME learns the id first.
            text = _receipt_text(message_id, answer.receipt)
            self.receipts[message_id] = text
            body = _deliver_sm_body(message_id, submit, answer.receipt, text)
            asyncio.get_running_loop().call_later(
                self.receipt_delay, self._receipts.put_nowait, body
            )

    async def _send_receipts(self, link: _Link) -> None:
        while True:
            body = await self._receipts.get()
            link.send(DELIVER_SM, ESME_ROK, link.next_sequence(), body)
            await link.writer.drain()


def _c_octet(text: str) -> bytes:
    return text.encode("latin-1") + b"\0"


def _c_octets(body: bytes, at: int) -> tuple[str, int]:
    """The C-Octet String at `at` (§3.1) and where the next field starts."""
    end = body.index(b"\0", at)
    return body[at:end].decode("latin-1"), end + 1


def _read_submit(body: bytes) -> Submit:
    """The fields of a submit_sm body (§4.4.1) the simulator uses."""
    _service_type, at = _c_octets(body, 0)
    source_addr, at = _c_octets(body, at + 2)  # after source_addr_ton, source_addr_npi
    destination_addr, at = _c_octets(body, at + 2)  # after dest_addr_ton, dest_addr_npi
    at += 3  # esm_class, protocol_id, priority_flag
    _schedule, at = _c_octets(body, at)
    _validity, at = _c_octets(body, at)
    registered_delivery, _replace, data_coding, _default_id, length = body[at : at + 5]
    at += 5
    return Submit(
        source_addr, destination_addr, registered_delivery, data_coding, body[at : at + length]
    )


def _receipt_text(message_id: str, receipt: Receipt) -> bytes:
    """The receipt's short_message in Appendix B form."""
    now = datetime.now(UTC).strftime("%y%m%d%H%M")
    delivered = "001" if receipt.stat == "DELIVRD" else "000"
    return (
        f"id:{message_id} sub:001 dlvrd:{delivered} submit date:{now} done date:{now}"
        f" stat:{receipt.stat} err:{receipt.err} text:"
    ).encode("ascii") + receipt.text


def _deliver_sm_body(message_id: str, submit: Submit, receipt: Receipt, text: bytes) -> bytes:
    """A deliver_sm carrying the receipt of `submit` (§4.6.1, Appendix B), from the handset."""
    tlvs = struct.pack(">HH", _TLV_RECEIPTED_MESSAGE_ID, len(message_id) + 1) + _c_octet(message_id)
    state = _MESSAGE_STATES.get(receipt.stat)
    if state is not None:
        tlvs += struct.pack(">HHB", _TLV_MESSAGE_STATE, 1, state)
    return (
        b"\0"  # service_type
        + b"\1\1"
        + _c_octet(submit.destination_addr)  # from the handset...
        + b"\1\1"
        + _c_octet(submit.source_addr)  # ...to the sender
        + bytes([_ESM_CLASS_RECEIPT, 0, 0])
        + b"\0\0"  # schedule_delivery_time, validity_period: none in a receipt
        + bytes([0, 0, 0, 0, len(text)])  # registered_delivery .. sm_length
        + text
        + tlvs
    )
