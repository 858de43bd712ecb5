"""`Silence`: a timeout on each wait, with one timer for all of them; the event log's readers,
which wait through it."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from oars.eventlog import EventLog
from oars.silence import Silence


def test_a_wait_longer_than_allowed_is_a_timeout() -> None:
    async def go() -> float:
        silence = Silence(0.2)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await silence.wait(asyncio.sleep(5))
        silence.close()
        return time.monotonic() - started

    assert 0.2 <= asyncio.run(go()) < 1.0


def test_short_waits_never_time_out_however_long_they_last_together() -> None:
    async def go() -> list[object]:
        silence = Silence(0.1)
        got = [await silence.wait(_after(0.02, i)) for i in range(25)]  # 0.5 s in all
        silence.close()
        return got

    assert asyncio.run(go()) == list(range(25))


def test_what_runs_between_waits_is_never_cancelled() -> None:
    async def go() -> str:
        silence = Silence(0.05)
        await silence.wait(_after(0.01, None))
        await asyncio.sleep(0.3)  # the timer fires meanwhile: not in a wait, nothing happens
        result = await silence.wait(_after(0.01, "still here"))
        silence.close()
        return str(result)

    assert asyncio.run(go()) == "still here"


def test_a_shorter_allowance_takes_effect_at_once() -> None:
    async def go() -> float:
        silence = Silence(30.0)
        await silence.wait(_after(0.01, None))
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await silence.wait(asyncio.sleep(5), 0.1)
        silence.close()
        return time.monotonic() - started

    assert 0.1 <= asyncio.run(go()) < 1.0


def test_a_cancel_from_outside_stays_a_cancel() -> None:
    async def go() -> None:
        silence = Silence(5.0)
        task = asyncio.create_task(silence.wait(asyncio.sleep(5)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        silence.close()

    asyncio.run(go())


def test_a_timeout_stays_a_timeout_in_a_task_that_once_swallowed_a_cancel() -> None:
    """As `asyncio.timeout`: only the cancels it asked for itself are its own."""

    async def go() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # swallowed, its count left as is
            await asyncio.sleep(5)
        silence = Silence(0.05)
        with pytest.raises(TimeoutError):
            await silence.wait(asyncio.sleep(5))
        silence.close()

    async def main() -> None:
        task = asyncio.create_task(go())
        await asyncio.sleep(0.01)
        task.cancel()
        await task

    asyncio.run(main())


def test_one_timer_serves_every_wait() -> None:
    """The point of it: a wait schedules no timer of its own."""

    async def go() -> int:
        loop = asyncio.get_running_loop()
        scheduled = 0
        call_at = loop.call_at

        def counted(*args: object, **kwargs: object) -> asyncio.TimerHandle:
            nonlocal scheduled
            scheduled += 1
            return call_at(*args, **kwargs)  # type: ignore[arg-type]

        loop.call_at = counted  # type: ignore[method-assign]
        silence = Silence(10.0)
        for _ in range(200):
            await silence.wait(_after(0, None))
        silence.close()
        return scheduled

    assert asyncio.run(go()) == 1


async def _after(seconds: float, value: object) -> object:
    await asyncio.sleep(seconds)
    return value


def test_log_readers_get_every_batch_and_silences_leave_no_waiters_behind() -> None:
    async def read(log: EventLog, keepalive: float | None) -> list[list[str]]:
        return [[e["type"] for e in batch] async for batch in log.follow(-1, keepalive)]

    async def go() -> tuple[list[list[str]], list[list[str]], int]:
        log = EventLog()
        quiet = asyncio.create_task(read(log, 0.05))  # keep-alives while nothing comes
        plain = asyncio.create_task(read(log, None))
        await asyncio.sleep(0.3)
        waiting = len(log._waiting)  # one a reader, however many silences went by
        log.append([{"type": "a"}])
        await asyncio.sleep(0)
        log.append([{"type": "b"}, {"type": "c"}])
        log.close()
        return await quiet, await plain, waiting

    quiet, plain, waiting = asyncio.run(go())
    assert waiting == 2
    assert plain == [["a"], ["b", "c"]]
    assert [batch for batch in quiet if batch] == plain
    assert quiet.count([]) >= 4  # the silences, as empty batches
