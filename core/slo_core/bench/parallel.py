"""Process pools for the bench's independent runs that never outlive the process that started them.

A sweep interrupted with SIGTERM or Ctrl-C, or killed outright, used to leave its pool's workers
computing runs whose results nobody would read: on this 2-core host two such orphans took a third of
the machine for minutes from the sweep started after them. Here:

- each worker asks Linux to send it SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``, so a
  ``kill -9`` of the sweep ends its workers too; elsewhere this is skipped);
- SIGTERM in the parent raises ``SystemExit`` like Ctrl-C's ``KeyboardInterrupt``, and leaving the
  ``with`` block on any exception terminates the workers at once instead of waiting for their runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import multiprocessing
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from types import FrameType

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """A pool worker's initializer: SIGTERM ends the worker, and (Linux) the kernel sends it SIGTERM
    when the parent process dies.

    A forked worker inherits its parent's signal handlers. If the parent had one for SIGTERM that
    does not exit (a uvicorn server run in-process sets a flag and returns), ``Pool.terminate`` hung
    for good: it holds the task queue's read lock while it signals the workers, and a worker that
    shrugs the signal off waits on that lock forever (seen in the test suite under load)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _sigterm_exits(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def process_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A spawn-context pool of ``workers`` processes (no inherited threads or state) whose workers end
    with it: on an exception (Ctrl-C, SIGTERM, a failed run) they are terminated, not waited for."""
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=die_with_parent)
    restore = None
    if threading.current_thread() is threading.main_thread():
        restore = signal.signal(signal.SIGTERM, _sigterm_exits)
    try:
        yield pool
    except BaseException:
        terminate(pool)
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        if restore is not None:
            signal.signal(signal.SIGTERM, restore)


def terminate(pool: ProcessPoolExecutor) -> None:
    """Stop ``pool`` now: pending runs cancelled, running ones killed with their worker."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    for proc in processes:
        proc.join(timeout=5.0)
