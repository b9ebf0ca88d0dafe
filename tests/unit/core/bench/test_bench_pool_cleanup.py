"""A bench pool's workers end with the sweep that started them (SIGTERM, Ctrl-C or kill -9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

PARENT = textwrap.dedent(
    """
    import signal, sys, time
    from slo_core.bench.parallel import process_pool

    # Ctrl-C as at a terminal: a test run started as a background job of a non-interactive shell
    # inherits SIGINT ignored, and Python then leaves it ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)

    with process_pool(2) as pool:
        futures = [pool.submit(time.sleep, 120) for _ in range(4)]
        time.sleep(0.5)
        while len(getattr(pool, "_processes", {})) < 2:
            time.sleep(0.1)
        print(" ".join(str(pid) for pid in pool._processes), flush=True)
        for f in futures:
            f.result()
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its parent's wait is missing


def _workers_of_a_parent_sent(sig: signal.Signals) -> list[int]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = [int(x) for x in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        parent.send_signal(sig)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [p for p in pids if _alive(p)]
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PDEATHSIG is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_workers_do_not_outlive_their_sweep(sig: signal.Signals) -> None:
    left = _workers_of_a_parent_sent(sig)
    for pid in left:  # do not leave them behind for the rest of the test run either
        os.kill(pid, signal.SIGKILL)
    assert left == []


FORKED_WORKER = textwrap.dedent(
    """
    import signal
    from multiprocessing import get_context
    from slo_core.bench.parallel import die_with_parent

    def worker(lock):
        die_with_parent()  # what Pool runs first in each worker (its initializer)
        with lock:  # the task queue's read lock, held by a parent terminating its pool
            pass

    # a handler that sets a flag and returns, as a uvicorn server run in-process leaves behind
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    ctx = get_context("fork")
    lock = ctx.Lock()
    lock.acquire()
    child = ctx.Process(target=worker, args=(lock,))
    child.start()
    ready = ctx.Event()  # give the child time to block on the lock
    ready.wait(0.5)
    child.terminate()
    child.join(20)
    print(child.exitcode, flush=True)  # None: it shrugged SIGTERM off too
    if child.exitcode is None:
        child.kill()
        child.join()
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork start method")
def test_a_forked_worker_ends_on_sigterm_though_its_parent_shrugs_it_off() -> None:
    """bench/compare/run.py's forked Pool terminates its workers while holding their task queue's read
    lock; a worker that inherited a SIGTERM handler that returns waited on that lock forever (the test
    suite hung so under load, after an in-process uvicorn left its handler installed). The pool's
    initializer restores SIGTERM's default, so the worker ends."""
    done = subprocess.run([sys.executable, "-c", FORKED_WORKER], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(-signal.SIGTERM)]
