"""The serve pool's slot gate: permits first come, first served; a waiter times out or is
cancelled without losing or doubling a permit."""

from __future__ import annotations

import asyncio

from pivot_envs.serve.sessions import SlotGate


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
