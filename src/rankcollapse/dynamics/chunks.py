"""Chunks of the windowed kernel spread over worker threads (one intra-op thread each).

Each small op under T > 1 intra-op threads ends in an OpenMP barrier, which waits for any
descheduled thread on shared cores; T Python threads each taking every T-th chunk with one
intra-op thread need one join per call.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable, Sequence

import torch

PARALLEL_CHUNKS = True
_POOL: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_WORKERS: list[int] = []  # set by chunk_threads(): chunk workers while intra-op threads are 1


@contextlib.contextmanager
def chunk_threads():
    """Run a block of layers with one intra-op thread, the kernel's chunks spread over the
    former thread count of Python threads (:func:`over_chunks`); restored on exit."""
    threads = torch.get_num_threads()
    if threads < 2 or not PARALLEL_CHUNKS:
        yield
        return
    _WORKERS.append(threads)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        _WORKERS.pop()


def over_chunks(chunk, starts: Sequence, device: torch.device, *,
                per_thread: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> None:
    """Run ``chunk(s)`` for every ``s`` of ``starts``, across worker threads on the CPU (chunks
    write disjoint rows: the result does not depend on the schedule); each thread runs its
    chunks inside ``per_thread()`` (a thread's own settings, such as the float mode)."""
    threads = _WORKERS[-1] if _WORKERS else torch.get_num_threads()
    if not PARALLEL_CHUNKS or threads < 2 or len(starts) < 2 or device.type != "cpu":
        with per_thread():
            for s in starts:
                chunk(s)
        return
    workers = min(threads, len(starts))
    pool = _POOL.get(workers)
    if pool is None:
        pool = _POOL[workers] = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="rankcollapse-chunks")

    # grad and inference mode are per thread: the workers run in the caller's
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def part(t: int) -> None:
        # OpenMP's thread count is per thread: a worker left at its default would run every op,
        # and every BLAS call of the native kernel, on an OpenMP team of its own (oversubscribed)
        torch.set_num_threads(1)
        with torch.inference_mode(inference), torch.set_grad_enabled(grad), per_thread():
            for s in starts[t::workers]:
                chunk(s)

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for f in [pool.submit(part, t) for t in range(workers)]:
            f.result()
    finally:
        torch.set_num_threads(before)
