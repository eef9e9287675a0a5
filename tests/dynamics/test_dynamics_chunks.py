"""The chunk threads of :mod:`rankcollapse.dynamics.chunks`: one OpenMP thread per worker,
every chunk run once whichever thread takes it, the projection's rows spread over them."""

import pytest
import torch


def test_chunk_workers_run_one_intra_op_thread_each():
    """The chunks spread over T Python threads; each runs its ops (and the native kernel's BLAS
    calls) on one OpenMP thread, never a team of its own per worker; the caller's count is restored."""
    import ctypes
    from pathlib import Path

    from rankcollapse.dynamics.chunks import over_chunks

    lib = Path(torch.__file__).parent / "lib" / "libgomp.so.1"  # the OpenMP runtime of Linux wheels
    if not lib.exists():
        pytest.skip("this torch build ships no libgomp")
    team = ctypes.CDLL(str(lib)).omp_get_max_threads  # per thread, unlike torch.get_num_threads
    seen: set[int] = set()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        over_chunks(lambda _: seen.add(team()), range(8), torch.device("cpu"))
        assert seen == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_over_chunks_runs_every_chunk_once_and_raises_a_chunks_error(threads):
    """Threads take chunks as they free up: every start runs exactly once, whichever thread takes
    it; an error in a chunk reaches the caller after the others finish, thread count restored."""
    import collections
    import threading

    from rankcollapse.dynamics.chunks import over_chunks

    runs, lock = collections.Counter(), threading.Lock()

    def chunk(s):
        with lock:
            runs[s] += 1
        if s == 13:
            raise ValueError("chunk 13")

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with pytest.raises(ValueError, match="chunk 13"):
            over_chunks(chunk, range(40), torch.device("cpu"))
        assert torch.get_num_threads() == threads
        runs.clear()
        over_chunks(lambda s: chunk(s) if s != 13 else runs.update([s]), range(40), torch.device("cpu"))
    finally:
        torch.set_num_threads(before)
    assert runs == collections.Counter(range(40))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_matmul_spreads_rows_over_the_chunk_workers(threads, dtype, monkeypatch):
    """Inside chunk_threads the projection's rows go to the chunk workers: every row of X W is
    computed (against one matmul and a float64 reference), into the given buffer."""
    from rankcollapse.dynamics import chunks

    monkeypatch.setattr(chunks, "ROWS_MATMUL_MIN", 0)
    X = torch.randn(2, 1001, 24, generator=torch.Generator().manual_seed(0), dtype=dtype)
    W = torch.randn(24, 40, generator=torch.Generator().manual_seed(1), dtype=dtype)
    out = torch.full((2, 1001, 40), float("nan"), dtype=dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with chunks.chunk_threads():
            Y = chunks.rows_matmul(X, W, out)
            assert bool(chunks._WORKERS) == (threads > 1)
    finally:
        torch.set_num_threads(before)
    assert Y.data_ptr() == out.data_ptr()
    torch.testing.assert_close(Y, X @ W)
    torch.testing.assert_close(Y.double(), X.double() @ W.double(), rtol=0, atol=50 * torch.finfo(dtype).eps * 24 * 16)
