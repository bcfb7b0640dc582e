"""sandbox_agent/loop_threads.py: blocking work awaited from an event loop, in worker threads."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sandbox_agent.loop_threads import LoopThreads


def test_work_runs_in_a_worker_thread_and_its_outcome_comes_back() -> None:
    threads = LoopThreads(4, "test")

    async def main() -> tuple[str, str]:
        name = await threads.run(lambda: threading.current_thread().name)
        return name, threading.current_thread().name

    worker, loop_thread = asyncio.run(main())
    threads.close()
    assert worker == "test_0"
    assert loop_thread != worker


def test_an_exception_reaches_the_awaiting_task() -> None:
    threads = LoopThreads(2, "test")

    def fails() -> None:
        raise KeyError("gone")

    async def main() -> None:
        await threads.run(fails)

    with pytest.raises(KeyError, match="gone"):
        asyncio.run(main())
    threads.close()


def test_at_most_max_threads_run_at_once_and_the_rest_wait_their_turn() -> None:
    threads = LoopThreads(3, "test")
    running = 0
    most = 0
    lock = threading.Lock()
    release = threading.Event()

    def work() -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(10)
        with lock:
            running -= 1
        return 1

    async def main() -> int:
        futures = [threads.run(work) for _ in range(10)]
        await asyncio.sleep(0.2)  # every thread that will start has started
        assert most == 3
        release.set()
        return sum(await asyncio.gather(*futures))

    assert asyncio.run(main()) == 10
    assert most == 3
    threads.close()


def test_an_idle_worker_takes_the_next_item_instead_of_a_new_thread() -> None:
    threads = LoopThreads(8, "test")

    async def main() -> set[str]:
        names = set()
        for _ in range(20):  # one after the other: one worker does them all
            names.add(await threads.run(lambda: threading.current_thread().name))
        return names

    assert asyncio.run(main()) == {"test_0"}
    threads.close()


def test_work_cancelled_before_a_worker_takes_it_never_runs() -> None:
    threads = LoopThreads(1, "test")
    release = threading.Event()
    ran = []

    async def main() -> None:
        busy = threads.run(lambda: release.wait(10))
        queued = threads.run(lambda: ran.append("queued"))
        queued.cancel()
        release.set()
        await busy
        await threads.run(lambda: None)  # the worker has passed the cancelled item

    asyncio.run(main())
    threads.close()
    assert ran == []


def test_closed_workers_end_and_a_closed_pool_takes_no_work() -> None:
    threads = LoopThreads(2, "closing")

    async def main() -> None:
        await asyncio.gather(threads.run(lambda: None), threads.run(lambda: None))

    asyncio.run(main())
    workers = [t for t in threading.enumerate() if t.name.startswith("closing_")]
    assert workers
    threads.close()
    for worker in workers:
        worker.join(5)
        assert not worker.is_alive()

    async def after() -> None:
        await threads.run(lambda: None)

    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(after())
