"""threads.run_parallel: the calling thread takes tasks beside the pool's threads; every task runs once, results
are as one thread gives them, a failure is raised in task order, and a run_parallel inside a pool task (all pool
threads busy) still finishes (the caller drains what no pool thread took)."""
from __future__ import annotations

import threading
import time

import pytest

from anydevice.backend.system import cancel, threads


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setenv("ANYDEVICE_NUM_THREADS", "2")
    threads.pool()  # made with 2 workers if new; an older pool has at least as many
    yield


def test_every_task_runs_once_and_the_caller_takes_some(two_threads):
    seen, who = [], set()
    lock = threading.Lock()

    def task(i):
        time.sleep(0.002)
        with lock:
            seen.append(i)
            who.add(threading.get_ident())
    threads.run_parallel(task, range(40))
    assert sorted(seen) == list(range(40))
    assert threading.get_ident() in who  # the caller worked too
    assert len(who) <= threads.num_threads()


def test_the_first_failure_in_task_order_is_raised(two_threads):
    def task(i):
        if i in (3, 7):
            raise ValueError(f"task {i}")
    with pytest.raises(ValueError, match="task 3"):
        threads.run_parallel(task, range(10))


def test_an_abandoned_sibling_is_not_what_is_raised(two_threads):
    started = threading.Event()

    def task(i):
        if i == 0:
            started.wait(2)
            raise KeyError("first")
        started.set()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2:  # ends at its next check once task 0 failed
            cancel.check()
            time.sleep(0.001)
    t0 = time.monotonic()
    with pytest.raises(KeyError, match="first"):
        threads.run_parallel(task, range(2))
    assert time.monotonic() - t0 < 1.5


def test_nested_run_parallel_from_every_pool_thread_finishes(two_threads):
    """Each outer task (one on every pool thread and the caller) runs an inner run_parallel: with no pool
    thread free, its caller runs the inner tasks itself."""
    out = []
    lock = threading.Lock()

    def inner(j):
        with lock:
            out.append(j)

    def outer(i):
        threads.run_parallel(inner, range(i * 10, i * 10 + 10))
    done = threading.Event()

    def run():
        threads.run_parallel(outer, range(4))
        done.set()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert done.wait(20), "nested run_parallel did not finish"
    assert sorted(out) == list(range(40))


def test_one_task_or_one_thread_runs_inline(monkeypatch):
    monkeypatch.setenv("ANYDEVICE_NUM_THREADS", "1")
    who = []
    threads.run_parallel(lambda i: who.append(threading.get_ident()), range(5))
    assert set(who) == {threading.get_ident()}
