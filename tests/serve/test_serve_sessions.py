"""The serve pool's slot gate: permits first come, first served; a waiter times out or is
cancelled without losing or doubling a permit. A request waiting for a session's lock."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from pivot_envs.serve.server import _held
from pivot_envs.serve.sessions import SlotGate, UnknownSession


def run(coroutine):
    return asyncio.run(coroutine)


def test_waiters_get_released_permits_in_arrival_order():
    async def scenario() -> list[int]:
        gate, order = SlotGate(1), []
        assert await gate.acquire(0)

        async def wait(number: int) -> None:
            assert await gate.acquire(5)
            order.append(number)

        tasks = [asyncio.create_task(wait(n)) for n in range(3)]
        await asyncio.sleep(0.01)
        assert gate.waiting == 3
        for _ in range(3):
            gate.release()
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        return order

    assert run(scenario()) == [0, 1, 2]


def test_a_waiter_that_times_out_leaves_the_queue_and_takes_no_permit():
    async def scenario() -> tuple[bool, int, int]:
        gate = SlotGate(1)
        await gate.acquire(0)
        timed_out = await gate.acquire(0.05)
        waiting = gate.waiting
        gate.release()
        return timed_out, waiting, gate.free

    assert run(scenario()) == (False, 0, 1)


def test_a_waiter_cancelled_after_a_permit_was_handed_to_it_gives_the_permit_back():
    async def scenario() -> int:
        gate = SlotGate(1)
        await gate.acquire(0)
        waiter = asyncio.create_task(gate.acquire(5))
        await asyncio.sleep(0.01)
        gate.release()  # hands the permit to the waiter's future...
        waiter.cancel()  # ...which is cancelled before it runs again
        try:
            await waiter
        except asyncio.CancelledError:
            pass
        return gate.free

    assert run(scenario()) == 1


def test_a_request_waiting_for_a_session_that_is_closed_meanwhile_is_refused_as_unknown():
    session = SimpleNamespace(id="s1", lock=asyncio.Lock(), closed=False)
    pool = SimpleNamespace(get=lambda session_id: session)

    async def request() -> None:
        async with _held(pool, "s1"):
            pytest.fail("the request went on with a closed session")

    async def scenario() -> None:
        async with session.lock:  # an earlier request holds the session
            waiting = asyncio.create_task(request())
            await asyncio.sleep(0.01)
            session.closed = True
        with pytest.raises(UnknownSession, match="'s1' was closed while this request waited for it"):
            await waiting

    run(scenario())
