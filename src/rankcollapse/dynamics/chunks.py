"""Chunks of the windowed kernel spread over worker threads (one intra-op thread each).

Each small op under T > 1 intra-op threads ends in an OpenMP barrier, which waits for any
descheduled thread on shared cores; T Python threads (the caller one of them) each taking the
next chunk left, with one intra-op thread, need one join per call. The layer's projection is
spread over the same threads by rows (:func:`rows_matmul`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Sequence

import torch

PARALLEL_CHUNKS = True
ROWS_MATMUL_MIN = 2**22  # multiply-adds below which one matmul beats handing rows to the workers
_DONE = object()
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
    pool = _POOL.get(workers - 1)
    if pool is None:
        pool = _POOL[workers - 1] = concurrent.futures.ThreadPoolExecutor(workers - 1, thread_name_prefix="rankcollapse-chunks")

    # grad and inference mode are per thread: the workers run in the caller's
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()
    todo, lock = iter(starts), threading.Lock()  # each thread takes the next chunk: no thread idles on a slow one

    def part() -> None:
        # OpenMP's thread count is per thread: a worker left at its default would run every op,
        # and every BLAS call of the native kernel, on an OpenMP team of its own (oversubscribed)
        torch.set_num_threads(1)
        with torch.inference_mode(inference), torch.set_grad_enabled(grad), per_thread():
            while True:
                with lock:
                    s = next(todo, _DONE)
                if s is _DONE:
                    return
                chunk(s)

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        futures = [pool.submit(part) for _ in range(workers - 1)]
        try:
            part()  # the caller is one of the workers
        finally:
            for f in futures:
                f.result()
    finally:
        torch.set_num_threads(before)


def rows_matmul(X: torch.Tensor, W: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``X W`` for ``X`` ``(..., n, d)``, ``W`` ``(d, m)``, its rows spread over the chunk workers
    while :func:`chunk_threads` holds the intra-op threads at 1 (else one ``torch.matmul``); equal
    to one matmul to round-off (BLAS may take another kernel for a block of rows), the same
    bits for the same thread count."""
    rows = X.numel() // max(1, X.shape[-1])
    if not _WORKERS or X.device.type != "cpu" or rows * X.shape[-1] * W.shape[1] < ROWS_MATMUL_MIN or not X.is_contiguous():
        return torch.matmul(X, W) if out is None else torch.matmul(X, W, out=out)
    out = X.new_empty(*X.shape[:-1], W.shape[1]) if out is None else out
    X2, out2 = X.reshape(rows, -1), out.view(rows, -1)
    step = -(-rows // (2 * _WORKERS[-1]))
    over_chunks(lambda a: torch.matmul(X2[a:a + step], W, out=out2[a:a + step]), range(0, rows, step), X.device)
    return out
