"""fusecore.scratch: zeroed buffers kept per name, device and stream, fresh during CUDA-graph capture."""

import pytest
import torch

from fusecore.scratch import stream_key, zeroed


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
