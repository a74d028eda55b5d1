"""fusecore.scratch: zeroed and uninitialised buffers kept per name, device, stream (and thread), fresh during
CUDA-graph capture."""

import threading

import pytest
import torch

from fusecore import scratch
from fusecore.scratch import kept, stream_key, zeroed


def test_zeroed_keeps_one_buffer_per_name_shape_and_dtype():
    cache: dict = {}
    device = torch.device("cpu")
    a = zeroed(cache, "counts", 5, torch.int32, device)
    assert a.dtype == torch.int32 and tuple(a.shape) == (5,) and not a.any()
    assert zeroed(cache, "counts", 5, torch.int32, device) is a  # kept: no allocation, no fill
    assert zeroed(cache, "counts", 3, torch.int32, device) is a  # at least as many elements as asked for
    b = zeroed(cache, "other", 5, torch.int32, device)
    assert b is not a and len(cache) == 2
    c = zeroed(cache, "counts", 7, torch.int32, device)  # more elements replace the kept one
    assert c is not a and tuple(c.shape) == (7,) and zeroed(cache, "counts", 7, torch.int32, device) is c
    d = zeroed(cache, "counts", 7, torch.int64, device)
    assert d is not c and d.dtype == torch.int64
    assert tuple(zeroed(cache, "none", 0, torch.int32, device).shape) == (1,)
    own = zeroed(None, "module's own", 4, torch.int32, device)  # no cache named: the module keeps it
    assert zeroed(None, "module's own", 4, torch.int32, device) is own and "module's own" not in {k[0] for k in cache}
    assert stream_key(device) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_zeroed_per_stream_and_fresh_under_capture():
    cache: dict = {}
    device = torch.device("cuda", torch.cuda.current_device())
    a = zeroed(cache, "counts", 3, torch.int32, device)
    assert zeroed(cache, "counts", 3, torch.int32, device) is a
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert stream_key(device) == side.cuda_stream
        b = zeroed(cache, "counts", 3, torch.int32, device)
    assert b is not a and len(cache) == 2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fresh = zeroed(cache, "counts", 3, torch.int32, device)
        fresh += 1
    assert len(cache) == 2 and all(t is not fresh for t in cache.values())
    graph.replay()
    torch.cuda.synchronize()
    assert fresh.tolist() == [1, 1, 1]


def test_kept_returns_one_buffer_per_name_shape_dtype_and_thread():
    cache: dict = {}
    device = torch.device("cpu")
    a = kept(cache, "delta", (5, 3), torch.float32, device)
    assert tuple(a.shape) == (5, 3) and a.dtype == torch.float32 and a.is_contiguous()
    assert kept(cache, "delta", (5, 3), torch.float32, device) is a  # kept: no allocation
    assert kept(cache, "delta", (5, 4), torch.float32, device) is not a  # another shape, another buffer
    assert kept(cache, "delta", (5, 3), torch.bfloat16, device) is not a
    assert kept(cache, "grad", (5, 3), torch.float32, device) is not a  # two buffers one call holds at once
    assert kept(cache, "delta", (5, 3), torch.float32, device) is a
    seen = []
    worker = threading.Thread(target=lambda: seen.append(kept(cache, "delta", (5, 3), torch.float32, device)))
    worker.start()
    worker.join()
    assert seen[0] is not a and kept(cache, "delta", (5, 3), torch.float32, device) is a  # one per thread
    zero = kept(cache, "empty", (0, 3), torch.float32, device)
    assert tuple(zero.shape) == (0, 3) and kept(cache, "empty", (0, 3), torch.float32, device) is zero
    counts = zeroed(cache, "counts", 4, torch.int32, device)  # zeroed and kept buffers share a cache
    assert kept(cache, "delta", (5, 3), torch.float32, device) is a and zeroed(cache, "counts", 4, torch.int32,
                                                                               device) is counts


def test_kept_bounds_what_a_cache_holds(monkeypatch):
    cache: dict = {}
    device = torch.device("cpu")
    monkeypatch.setattr(scratch, "KEEP_MAX_BYTES", 1000)
    counts = zeroed(cache, "counts", 4, torch.int32, device)
    a = kept(cache, "a", (100,), torch.float32, device)  # 400 bytes
    b = kept(cache, "b", (100,), torch.float32, device)  # 800 in all
    assert kept(cache, "a", (100,), torch.float32, device) is a and kept(cache, "b", (100,), torch.float32, device) is b
    c = kept(cache, "c", (100,), torch.float32, device)  # 1200 > 1000: the kept buffers go first
    assert kept(cache, "c", (100,), torch.float32, device) is c
    assert kept(cache, "a", (100,), torch.float32, device) is not a
    assert zeroed(cache, "counts", 4, torch.int32, device) is counts  # zeroed buffers are not dropped
    big = kept(cache, "big", (251,), torch.float32, device)  # 1004 bytes alone: never kept
    assert tuple(big.shape) == (251,) and kept(cache, "big", (251,), torch.float32, device) is not big
    assert all(t.numel() <= 100 for t in cache.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kept_per_stream_and_fresh_under_capture():
    cache: dict = {}
    device = torch.device("cuda", torch.cuda.current_device())
    a = kept(cache, "delta", (3,), torch.float32, device)
    assert kept(cache, "delta", (3,), torch.float32, device) is a
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        b = kept(cache, "delta", (3,), torch.float32, device)
    assert b is not a and len(cache) == 2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fresh = kept(cache, "delta", (3,), torch.float32, device)
        fresh.fill_(2.0)
    assert len(cache) == 2 and all(t is not fresh for t in cache.values())
    graph.replay()
    torch.cuda.synchronize()
    assert fresh.tolist() == [2.0, 2.0, 2.0]
