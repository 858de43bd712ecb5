"""The handover from the engine thread to event loops: nothing goes before a flush, everything
posted goes in order, one wake-up per loop per flush however much was posted."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from oars.engines import handover as handover_module
from oars.engines.handover import Handover, Inbox, Mailbox


def test_posted_items_reach_their_loop_in_order_only_after_a_flush() -> None:
    async def main() -> None:
        handover = Handover()
        box = handover.mailbox(asyncio.get_running_loop())
        got: list[int] = []
        done = asyncio.Event()

        def engine() -> None:
            for i in range(5):
                handover.post(box, got.append, i)
            assert not got  # nothing moves before the flush
            handover.flush()
            for i in range(5, 8):
                handover.post(box, got.append, i)
            handover.post(box, lambda _: done.set(), None)
            handover.flush()

        thread = threading.Thread(target=engine)
        thread.start()
        await asyncio.wait_for(done.wait(), 5)
        thread.join()
        assert got == list(range(8))

    asyncio.run(main())


def test_one_wake_up_per_flush_however_many_items(monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[int] = []
    real = handover_module._write_byte

    def counting(fd: int) -> object:
        writes.append(fd)
        return real(fd)

    monkeypatch.setattr(handover_module, "_write_byte", counting)

    async def main() -> None:
        handover = Handover()
        box = handover.mailbox(asyncio.get_running_loop())
        got: list[int] = []
        for i in range(100):
            handover.post(box, got.append, i)
        handover.flush()
        handover.flush()  # nothing new: no second wake-up
        for _ in range(100):
            if len(got) == 100:
                break
            await asyncio.sleep(0.01)
        assert got == list(range(100))
        assert len(writes) == 1
        handover.post(box, got.append, 100)
        handover.flush()  # drained since: it wakes the loop again
        await asyncio.sleep(0.05)
        assert got[-1] == 100 and len(writes) == 2

    asyncio.run(main())


def test_each_loop_gets_its_own_items() -> None:
    handover = Handover()
    results: dict[str, list[str]] = {}
    ready = threading.Barrier(3)
    boxes: dict[str, Mailbox] = {}

    def serve(name: str) -> None:
        async def main() -> None:
            got: list[str] = []
            results[name] = got
            boxes[name] = handover.mailbox(asyncio.get_running_loop())
            ready.wait()
            while len(got) < 3:
                await asyncio.sleep(0.01)

        asyncio.run(main())

    threads = [threading.Thread(target=serve, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    ready.wait()
    for i in range(3):
        for name in ("a", "b"):
            handover.post(boxes[name], results[name].append, f"{name}{i}")
        handover.flush()
    for t in threads:
        t.join(5)
    assert results == {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"]}


def test_a_closed_loop_is_not_written_to_and_its_pipe_is_closed_with_it() -> None:
    handover = Handover()
    loop = asyncio.new_event_loop()
    box = handover.mailbox(loop)
    fds = (box._read, box._write)
    loop.close()
    handover.post(box, print, "never")
    handover.flush()  # no error, no write
    del box, loop
    import gc

    gc.collect()
    for fd in fds:
        try:
            os.fstat(fd)
        except OSError:
            continue
        raise AssertionError(f"fd {fd} is still open")


def test_an_inbox_gives_all_that_came_in_order_and_survives_a_cancelled_wait() -> None:
    async def main() -> None:
        inbox = Inbox()
        waiting = asyncio.create_task(inbox.take())
        await asyncio.sleep(0)
        waiting.cancel()  # a reader that stopped waiting (its client went away)
        with pytest.raises(asyncio.CancelledError):
            await waiting
        inbox.put(1)
        inbox.put(2)
        assert await inbox.take() == [1, 2]
        later = asyncio.create_task(inbox.take())
        await asyncio.sleep(0)
        assert not later.done()
        inbox.put(3)
        assert await asyncio.wait_for(later, 5) == [3]

    asyncio.run(main())
