"""Slow clients cannot starve the others (issue 34, item 4): a request must arrive whole (head and body) within
``read_timeout`` seconds of its first byte, however steadily its bytes trickle in, and when every connection slot is
taken a new client gets the slot of the slowest one (`RewardServer.reclaim_slot`). Slow-body, slow-head and silent
clients (asyncio raw sockets in one process) beside normal clients: every normal request is answered 200 within its
client's timeout, and no reply is a 500."""

from __future__ import annotations

import asyncio
import json
import time

from _helpers import StubRewardModel

from emoreward.export.serve.http import RewardServer
from emoreward.export.serve.protocol import ServerLimits
from emoreward.export.serve.service import RewardService


class Words(StubRewardModel):
    def reward(self, description, subtitle):
        return len(description.split()) / 10


BODY = json.dumps({"descriptions": ["a calm face"]}).encode()
HEAD = f"POST /v1/rewards HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"


async def _status(reader: asyncio.StreamReader) -> int | None:
    line = await reader.readline()
    return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else None


async def slow_client(port: int, kind: str, gap: float, stop: asyncio.Event, statuses: list) -> None:
    """One hostile client: ``body`` sends its head, then its body one byte every ``gap`` s; ``head`` sends its head
    one byte every ``gap`` s; ``silent`` connects and sends nothing. Records the status it was answered (None:
    closed without a reply)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = HEAD.encode() + BODY
    sent = len(HEAD) if kind == "body" else 0
    if sent:
        writer.write(data[:sent])
    try:
        while not stop.is_set() and not reader.at_eof():
            if kind != "silent" and sent < len(data) - 1:  # never the last byte: the request never completes
                writer.write(data[sent : sent + 1])
                sent += 1
            try:
                statuses.append(await asyncio.wait_for(_status(reader), gap))
                return
            except asyncio.TimeoutError:
                continue
    except (ConnectionError, OSError):
        statuses.append(None)
    finally:
        writer.close()


async def normal_client(port: int, timeout: float) -> tuple[int, float]:
    """One request, answered within ``timeout`` s: (status, seconds taken)."""
    start = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEAD.encode() + BODY)
    status = await asyncio.wait_for(_status(reader), timeout)
    writer.close()
    return status, time.monotonic() - start


async def crowd(port: int, slow: int, normal: int, timeout: float, gap: float) -> tuple[list, list]:
    stop, statuses = asyncio.Event(), []
    kinds = ("body", "head", "silent")
    hostile = []
    for i in range(slow):  # every slot taken by clients that send slowly or not at all
        hostile.append(asyncio.create_task(slow_client(port, kinds[i % 3], gap, stop, statuses)))
        if i % 100 == 99:
            await asyncio.sleep(0)
    await asyncio.sleep(1.5)  # past RECLAIM_AFTER_S: they have held their slots a while
    answers = []
    for _ in range(normal):
        answers.append(await normal_client(port, timeout))
    await asyncio.sleep(0.1)
    stop.set()
    await asyncio.gather(*hostile, return_exceptions=True)
    return answers, statuses


def _run(slots: int, slow: int, normal: int, read_timeout: float, gap: float):
    service = RewardService(Words(), ServerLimits(max_connections=slots, read_timeout=read_timeout))
    with RewardServer(service, port=0) as server:
        answers, statuses = asyncio.run(crowd(server.port, slow, normal, timeout=2.0, gap=gap))
        stats = service.stats
    return answers, statuses, stats


def test_slow_clients_holding_every_slot_do_not_push_normal_clients_past_their_timeout():
    answers, statuses, stats = _run(slots=12, slow=13, normal=10, read_timeout=30.0, gap=0.3)
    assert [status for status, _ in answers] == [200] * 10
    assert max(seconds for _, seconds in answers) < 2.0
    assert 500 not in statuses and all(status in (408, 503, None) for status in statuses)


def test_a_request_trickling_in_is_cut_at_its_whole_request_deadline():
    """One byte every 0.2 s keeps any per-read timeout from firing; the whole request's deadline still does."""

    async def main(port: int) -> tuple[list, float]:
        stop, statuses = asyncio.Event(), []
        start = time.monotonic()
        await asyncio.gather(*(slow_client(port, kind, 0.2, stop, statuses) for kind in ("body", "head")))
        return statuses, time.monotonic() - start

    service = RewardService(Words(), ServerLimits(read_timeout=1.5))
    with RewardServer(service, port=0) as server:
        statuses, seconds = asyncio.run(main(server.port))
    assert statuses == [408, 408] and seconds < 4.0  # the head alone is 118 bytes: 24 s at that pace


def test_a_thousand_slow_clients_do_not_push_normal_clients_past_their_timeout():
    answers, statuses, _ = _run(slots=1000, slow=1000, normal=50, read_timeout=60.0, gap=2.0)
    assert [status for status, _ in answers] == [200] * 50
    assert 500 not in statuses
