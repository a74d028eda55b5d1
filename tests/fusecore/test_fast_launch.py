"""fusecore.fast_launch: repeated launches skip Triton's dispatch and launch exactly as it would.

On the CPU the direct path is checked against a stand-in for Triton's ``run`` (the launch
protocol of Triton's JITFunction, with an independent specialisation key); on the GPU
(``-m gpu``) real kernels are launched with changing alignments, dtypes, integer classes,
constexprs, options, grids and streams and compared with torch.
"""

from __future__ import annotations

import functools
import random

import pytest
import torch

from fusecore import fast_launch
from fusecore.backend import COMPILED, jit, triton
from fusecore.fast_launch import arg_key

tl = triton.language


def _toy(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr = False, bias=None):
    pass


def _triton_spec(value):
    """Triton's specialisation of one runtime argument, derived independently of arg_key."""
    if isinstance(value, torch.Tensor):
        return ("ptr", str(value.dtype), value.data_ptr() % 16 == 0)
    if isinstance(value, bool) or value is None:
        return ("const", value)
    if isinstance(value, int):
        kind = "i32" if -(2**31) <= value < 2**31 else ("u64" if value >= 2**63 else "i64")
        return (kind, "constexpr 1" if value == 1 else ("D" if value % 16 == 0 else ""))
    if isinstance(value, float):
        return ("fp32",)
    if isinstance(value, tuple):
        return ("tuple", tuple(map(_triton_spec, value)))
    raise TypeError(type(value))


def _seeded(gen: torch.Generator) -> tuple[int, random.Random]:
    """A fresh seed drawn from the test's generator (reported on failure) and a ``random.Random`` on it."""
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    return seed, random.Random(seed)


class _Launcher:
    def __init__(self, log: list):
        self.log = log

    def __call__(self, *call):
        self.log.append(call)


class _Kernel:
    """A compiled kernel as Triton returns it: ``run`` is a property over ``_run``."""

    def __init__(self, spec, log: list):
        self.spec = spec
        self._run = None
        self._log = log

    @property
    def run(self):
        if self._run is None:
            self._run = _Launcher(self._log)
        return self._run


class _FakeTriton:
    """Triton's JITFunction.run protocol: compile per specialisation, then call the launcher."""

    STREAM = 0x5EED

    def __init__(self, function, *, all_params: bool, log: list):
        self.function = function
        self.all_params = all_params
        self.log = log
        self.kernels: dict = {}
        self.runs = 0
        names = list(function.signature.parameters)
        self.names = names
        self.constexpr = [kp.is_constexpr for kp in function.params]

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return self.STREAM

    def run(self, *args, grid, warmup, **kwargs):
        self.runs += 1
        params = {k: v for k, v in kwargs.items() if k in self.names}
        options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in self.names))
        bound = self.function.signature.bind(*args, **params)
        bound.apply_defaults()
        values = list(bound.arguments.values())
        spec = tuple(
            ("constexpr", v) if c else _triton_spec(v) for v, c in zip(values, self.constexpr)
        ) + options
        kernel = self.kernels.setdefault(spec, _Kernel(spec, self.log))
        if not warmup:
            if callable(grid):
                grid = grid(dict(bound.arguments))
            grid = tuple(grid) + (1,) * (3 - len(grid))
            passed = values if self.all_params else [v for v, c in zip(values, self.constexpr) if not c]
            kernel.run(*grid, self.STREAM, "function", kernel.spec, None, None, None, *passed)
        return kernel


def _fast_toy(all_params: bool = True, host_tensors: bool = True):
    """The toy kernel on the stand-in for Triton; CPU tensors stand in for device memory."""
    from triton.runtime.jit import JITFunction

    log: list = []
    function = fast_launch.fast(JITFunction(_toy))
    fake = _FakeTriton(function, all_params=all_params, log=log)
    function.run = fake.run
    function._fast_setup(driver=fake, host_tensors=host_tensors)
    return function, fake, log


@pytest.fixture
def enabled():
    before = fast_launch.fast_launch_enabled()
    fast_launch.set_fast_launch(True)
    yield
    fast_launch.set_fast_launch(before)


def _same_argument(a, b) -> bool:
    """The direct path passes a tensor as its address, Triton's path the tensor itself."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        address = [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in (a, b)]
        return address[0] == address[1]
    return a is b


def test_arg_key_separates_what_triton_specialises_on(enabled):
    base = torch.zeros(64, dtype=torch.float32)
    key = functools.partial(arg_key, host_tensors=True)  # CPU tensors stand in for device memory
    assert key(base) == key(torch.zeros(8, dtype=torch.float32))
    assert key(base) != key(base[1:])  # 4-byte aligned view
    assert key(base) != key(base.to(torch.float16))
    assert key(torch.nn.Parameter(base)) == key(base)
    ints = [1, 2, 16, 17, 2**31 - 16, 2**31, 2**63, -16, -1]
    keys = {v: arg_key(v) for v in ints}
    for a in ints:
        for b in ints:
            if _triton_spec(a) != _triton_spec(b):
                assert keys[a] != keys[b], (a, b)
    assert arg_key(0.5) == arg_key(2.0)
    assert arg_key(None) != arg_key(False) != arg_key(True)
    assert arg_key(True) != arg_key(1)
    assert arg_key((1, 2)) is fast_launch._SLOW
    assert arg_key(torch.zeros(2).numpy()) is fast_launch._SLOW


def test_generated_binder_binds_and_keys_like_arg_key(gen):
    """The generated binder places arguments and defaults as Python does and keys them with arg_key."""
    from triton.runtime.jit import JITFunction

    function = JITFunction(_toy)
    params = list(function.signature.parameters.values())
    constexpr = tuple(kp.is_constexpr for kp in function.params)
    base = torch.zeros(64)
    samples = [base, base[1:], base.half(), torch.nn.Parameter(base), 1, 16, 17, 2**31, -16, 2**63, 0.5, None,
               True, (1, 2)]
    for host in (True, False):
        bind = fast_launch._binder(params, constexpr, host)
        for _ in range(50):
            x, y, n, scale, bias = (samples[int(i)] for i in torch.randint(0, len(samples), (5,), generator=gen))
            bound = bind(x, y, n, scale, 32, bias=bias, num_warps=4)
            want = (*(arg_key(v, host) for v in (x, y, n, scale)), 32, False, arg_key(bias, host))
            if fast_launch._SLOW in want:
                assert bound is None
                continue
            values, full, runtime, key, options = bound
            assert values == (x, y, n, scale, 32, False, bias) and options == {"num_warps": 4}
            assert key == want
            address = [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values]
            assert full == tuple(address) and runtime == tuple(address[:4] + address[6:])
            assert all(type(v) is not torch.Tensor and not isinstance(v, torch.Tensor) for v in full)


@pytest.mark.parametrize("all_params", [True, False], ids=["constexprs passed", "runtime args only"])
def test_direct_launches_equal_tritons_over_a_random_sequence(enabled, all_params, gen):
    seed, rng = _seeded(gen)
    buffers = {dt: torch.zeros(64, dtype=dt) for dt in (torch.float32, torch.float16)}
    fast, fast_triton, fast_log = _fast_toy(all_params)
    slow, slow_triton, slow_log = _fast_toy(all_params)

    for _ in range(300):
        dtype = rng.choice(list(buffers))
        x = buffers[dtype][rng.choice([0, 0, 1, 8]):]
        y = torch.zeros(rng.randint(1, 9), dtype=torch.float32)
        n = rng.choice([1, 16, 17, 48, 2**31 + 16])
        args = [x, y, n, rng.random()]
        kwargs = {"BLOCK": rng.choice([32, 64])}
        if rng.random() < 0.5:
            kwargs["FLAG"] = rng.random() < 0.5
        if rng.random() < 0.3:
            kwargs["bias"] = y
        if rng.random() < 0.4:
            kwargs["num_warps"] = rng.choice([2, 4])
        if rng.random() < 0.3:
            args.append(kwargs.pop("BLOCK"))
        grid = rng.choice([(3,), (2, 5), lambda meta: (meta["BLOCK"] // 16, 2)])
        fast[grid](*args, **kwargs)
        fast_launch.set_fast_launch(False)
        slow[grid](*args, **kwargs)
        fast_launch.set_fast_launch(True)

    assert len(fast_log) == len(slow_log) == 300
    for got, want in zip(fast_log, slow_log):
        assert got[:4] == want[:4] and got[4:9] == want[4:9]
        assert len(got) == len(want) and all(map(_same_argument, got[9:], want[9:])), f"seed {seed}"
    direct = [call for call in fast_log if not isinstance(call[9], torch.Tensor)]
    assert len(direct) == 300 - len(fast_triton.kernels)  # every launch but each specialisation's first
    # Triton's run: twice per specialisation (compile, then the recorded launch), never again.
    assert fast_triton.runs == 2 * len(fast_triton.kernels)
    assert slow_triton.runs == 300
    assert set(fast_triton.kernels) == set(slow_triton.kernels)


def test_host_tensors_always_take_tritons_path(enabled):
    assert arg_key(torch.zeros(4)) is fast_launch._SLOW
    assert arg_key(torch.nn.Parameter(torch.zeros(4))) is fast_launch._SLOW
    function, fake, log = _fast_toy(host_tensors=False)
    x = torch.zeros(32)
    for _ in range(3):
        function[(1,)](x, x, 16, 1.0, BLOCK=32)
    assert fake.runs == 3 and all(call[9] is x for call in log)


def test_every_launch_of_a_specialisation_uses_its_own_kernel(enabled):
    function, fake, log = _fast_toy()
    x = torch.zeros(32)
    returned = [function[(1,)](x, x, 16, 1.0, BLOCK=32) for _ in range(3)]
    misaligned = function[(1,)](x[1:], x, 16, 1.0, BLOCK=32)
    other_block = function[(1,)](x, x, 16, 1.0, BLOCK=64)
    assert returned[0] is returned[1] is returned[2]
    assert len({id(returned[0]), id(misaligned), id(other_block)}) == 3
    assert fake.runs == 6 and len(log) == 5


def test_unhandled_arguments_and_hooks_take_tritons_path(enabled, monkeypatch):
    function, fake, log = _fast_toy()
    x = torch.zeros(32)
    for _ in range(3):
        function[(1,)](x, x, (1, 2), 1.0, BLOCK=32)  # a tuple argument: not mirrored by arg_key
    assert fake.runs == 3
    function[(1,)](x, x, 16, 1.0, BLOCK=32)
    function[(1,)](x, x, 16, 1.0, BLOCK=32)
    assert fake.runs == 5
    monkeypatch.setattr(fast_launch, "_hooks_active", lambda: True)
    function[(1,)](x, x, 16, 1.0, BLOCK=32)
    assert fake.runs == 6 and len(log) == 6
    monkeypatch.undo()
    fast_launch.set_fast_launch(False)
    function[(1,)](x, x, 16, 1.0, BLOCK=32)
    assert fake.runs == 7 and len(log) == 7


def test_a_launch_recorded_in_another_layout_is_never_repeated(enabled):
    function, fake, log = _fast_toy()

    def run_with_extra_argument(*args, grid, warmup, **kwargs):
        kernel = fake.run(*args, grid=grid, warmup=True, **kwargs)
        if not warmup:
            kernel.run(1, 1, 1, fake.STREAM, "function", object())  # not the protocol expected
        return kernel

    function.run = run_with_extra_argument
    x = torch.zeros(32)
    for _ in range(3):
        function[(1,)](x, x, 16, 1.0, BLOCK=32)
    assert len(log) == 3 and fake.runs == 4  # 1 compile + 3 launches all through run


def test_missing_and_duplicate_arguments_reach_tritons_error(enabled):
    function, fake, log = _fast_toy()
    x = torch.zeros(32)
    with pytest.raises(TypeError):
        function[(1,)](x, x, 16, 1.0)  # BLOCK missing
    with pytest.raises(TypeError):
        function[(1,)](x, x, 16, 1.0, 32, BLOCK=32)  # BLOCK twice
    assert log == []


def test_launch_profile_counts_launches_of_both_paths_inside_its_block(enabled):
    function, fake, log = _fast_toy()
    x = torch.zeros(32)
    function[(1,)](x, x, 16, 1.0, BLOCK=32)  # before the block: not counted
    with fast_launch.launch_profile() as stats:
        for _ in range(3):
            function[(1,)](x, x, 16, 1.0, BLOCK=32)  # direct
        function[(1,)](x, x, (1, 2), 1.0, BLOCK=32)  # Triton's path
    function[(1,)](x, x, 16, 1.0, BLOCK=32)  # after: not counted
    assert list(stats) == ["_toy"] and stats["_toy"].launches == 4 and stats["_toy"].host_s > 0
    assert len(log) == 6


# ----------------------------------------------------------------------------- prepared launches

_TOY_NAMES = ("x_ptr", "y_ptr", "n", "scale", "BLOCK", "FLAG", "bias")


@pytest.mark.parametrize("all_params", [True, False], ids=["constexprs passed", "runtime args only"])
def test_prepared_launches_equal_tritons_over_a_random_sequence(enabled, all_params, gen):
    """Whatever parameters are fixed, a prepared launch passes the launcher what Triton's own path passes, and
    Triton's path runs only for each (prepared launch, specialisation)'s first launch."""
    seed, rng = _seeded(gen)
    buffers = {dt: torch.zeros(64, dtype=dt) for dt in (torch.float32, torch.float16)}

    def draw(name):
        if name in ("x_ptr", "bias"):
            dtype = rng.choice(list(buffers))
            return buffers[dtype][rng.choice([0, 0, 1, 8]):] if name == "x_ptr" or rng.random() < 0.7 else None
        if name == "y_ptr":
            return torch.zeros(rng.randint(1, 9), dtype=torch.float32)
        if name == "n":
            return rng.choice([1, 16, 17, 48, 2**31 + 16])
        if name == "scale":
            return rng.random()
        if name == "BLOCK":
            return rng.choice([32, 64])
        return rng.random() < 0.5

    fast, fast_triton, fast_log = _fast_toy(all_params)
    slow, slow_triton, slow_log = _fast_toy(all_params)
    launches = 0
    for _ in range(12):
        dynamic = tuple(name for name in _TOY_NAMES if rng.random() < 0.5)
        fixed = {name: draw(name) for name in _TOY_NAMES if name not in dynamic
                 and (name not in ("FLAG", "bias") or rng.random() < 0.5)}
        if rng.random() < 0.4:
            fixed["num_warps"] = rng.choice([2, 4])
        grid = rng.choice([(3,), (2, 5), (1, 2, 3)])
        launch = fast_launch.prepare(fast, grid, dynamic, **fixed)
        for _ in range(25):
            values = [draw(name) for name in dynamic]
            launch(*values)
            merged = {**fixed, **dict(zip(dynamic, values))}
            fast_launch.set_fast_launch(False)
            slow[grid](**merged)
            fast_launch.set_fast_launch(True)
            launches += 1
    assert len(fast_log) == len(slow_log) == launches
    for got, want in zip(fast_log, slow_log):
        assert got[:4] == want[:4] and got[4:9] == want[4:9], f"seed {seed}"
        assert len(got) == len(want) and all(map(_same_argument, got[9:], want[9:])), f"seed {seed}"
    direct = sum(not any(isinstance(a, torch.Tensor) for a in call[9:]) for call in fast_log)
    assert direct >= launches - 2 * fast_triton.runs  # everything but first launches went direct
    assert set(fast_triton.kernels) == set(slow_triton.kernels)


def test_prepared_launch_of_a_kernel_not_compiled_here_passes_the_full_call():
    calls = []

    class Kernel:  # the interpreter's and the compile check's kernels: kernel[grid](*args, **options)
        fn = staticmethod(_toy)

        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))

    x, y = torch.zeros(4), torch.ones(4)
    launch = fast_launch.prepare(Kernel(), (7,), ("y_ptr", "scale"), x_ptr=x, n=5, BLOCK=32, num_warps=2)
    launch(y, 0.5)
    assert calls == [((7,), (x, y, 5, 0.5, 32, False, None), {"num_warps": 2})]
    with pytest.raises(TypeError, match="takes 2 arguments"):
        launch(y)


def test_prepare_names_what_is_wrong_with_its_arguments(enabled):
    function, _, _ = _fast_toy()
    x = torch.zeros(4)
    with pytest.raises(TypeError, match="'z' in dynamic is not a parameter"):
        fast_launch.prepare(function, (1,), ("z",), x_ptr=x, y_ptr=x, n=1, scale=1.0, BLOCK=32)
    with pytest.raises(TypeError, match="'n' is both dynamic and fixed"):
        fast_launch.prepare(function, (1,), ("n",), x_ptr=x, y_ptr=x, n=1, scale=1.0, BLOCK=32)
    with pytest.raises(TypeError, match="'BLOCK' of _toy is neither fixed nor dynamic"):
        fast_launch.prepare(function, (1,), ("n",), x_ptr=x, y_ptr=x, scale=1.0)
    with pytest.raises(TypeError, match="twice"):
        fast_launch.prepare(function, (1,), ("n", "n"), x_ptr=x, y_ptr=x, scale=1.0, BLOCK=32)
    for grid in (lambda meta: (1,), (1.0,), (), (1, 1, 1, 1)):
        with pytest.raises(TypeError, match="grid must be a tuple"):
            fast_launch.prepare(function, grid, ("n",), x_ptr=x, y_ptr=x, scale=1.0, BLOCK=32)


def test_prepared_launches_take_tritons_path_where_the_direct_path_would(enabled, monkeypatch):
    function, fake, log = _fast_toy()
    x = torch.zeros(32)
    launch = fast_launch.prepare(function, (1,), ("n",), x_ptr=x, y_ptr=x, scale=1.0, BLOCK=32)
    for _ in range(3):
        launch(16)
    assert fake.runs == 2 and len(log) == 3  # compile + the first launch through run, then direct
    for _ in range(2):
        launch((1, 2))  # an argument arg_key does not handle
    assert fake.runs == 4
    monkeypatch.setattr(fast_launch, "_hooks_active", lambda: True)
    launch(16)
    assert fake.runs == 5
    monkeypatch.undo()
    fast_launch.set_fast_launch(False)
    launch(16)
    assert fake.runs == 6
    fast_launch.set_fast_launch(True)
    runs = fake.runs
    with fast_launch.launch_profile() as stats:
        launch(16)
        launch(16)
        launch((1, 2))  # through kernel[grid]: counted there, once
    assert stats["_toy"].launches == 3 and stats["_toy"].host_s > 0 and len(log) == 10
    assert fake.runs == runs + 1  # the two direct launches stayed direct inside the block
    unhandled = fast_launch.prepare(function, (1,), ("n",), x_ptr=x, y_ptr=(1, 2), scale=1.0, BLOCK=32)
    unhandled(16)
    unhandled(16)
    assert fake.runs == runs + 3  # a fixed argument arg_key does not handle: Triton's path every time


def test_prepared_launch_check_finds_a_fixed_tensor_that_moved(enabled, monkeypatch):
    function, fake, log = _fast_toy()
    x, y = torch.zeros(32), torch.zeros(32)
    launch = fast_launch.prepare(function, (1,), ("n",), x_ptr=x, y_ptr=y, scale=1.0, BLOCK=32)
    monkeypatch.setattr(fast_launch, "CHECK_PREPARED", True)
    launch(16)
    launch(16)
    y.set_(torch.zeros(64).untyped_storage())
    with pytest.raises(fast_launch.PreparedLaunchError, match="moved"):
        launch(16)


# ----------------------------------------------------------------------------- GPU


@jit
def _axpb_kernel(x_ptr, out_ptr, n, a, b, BLOCK: tl.constexpr, SQUARE: tl.constexpr = False):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if SQUARE:
        x = x * x
    tl.store(out_ptr + offs, (x * a + b).to(out_ptr.dtype.element_ty), mask=mask)


def _axpb(x: torch.Tensor, a: float, b: int, square: bool) -> torch.Tensor:
    ref = x.double()
    return ((ref * ref if square else ref) * a + b).to(x.dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not COMPILED, reason="compiled kernels only")
def test_gpu_direct_launches_compute_what_triton_computes(enabled, gen):
    seed, rng = _seeded(gen)
    device = torch.device("cuda")
    side = torch.cuda.Stream()
    for step in range(200):
        dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16])
        offset = rng.choice([0, 0, 1, 3, 8])
        n = rng.choice([1, 16, 17, 64, 1000, 4099])
        base = torch.randn(n + offset, device=device, dtype=dtype)
        x = base[offset:]
        out_base = torch.full((n + offset,), float("nan"), device=device, dtype=dtype)
        out = out_base[rng.choice([0, offset]):][:n]
        a, b = rng.uniform(-2, 2), rng.choice([0, 1, 16, 5])
        block = rng.choice([32, 128])
        square = rng.random() < 0.5
        kwargs = {"SQUARE": square} if square or rng.random() < 0.5 else {}
        if rng.random() < 0.3:
            kwargs["num_warps"] = rng.choice([1, 4])
        grid = (triton.cdiv(n, block),)
        if rng.random() < 0.5:
            grid = lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)  # noqa: E731
        if rng.random() < 0.3:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                _axpb_kernel[grid](x, out, n, a, b, block, **kwargs)
            torch.cuda.current_stream().wait_stream(side)
        else:
            _axpb_kernel[grid](x, out, n, a, b, BLOCK=block, **kwargs)
        want = _axpb(x, a, b, square)
        torch.testing.assert_close(out.float(), want.float(), rtol=1e-2, atol=1e-2, msg=f"seed {seed} step {step}")
    assert any(e is not None for e in _axpb_kernel._fast_entries.values())


@pytest.mark.gpu
@pytest.mark.skipif(not COMPILED, reason="compiled kernels only")
def test_gpu_direct_launches_replay_in_a_cuda_graph(enabled):
    device = torch.device("cuda")
    x = torch.randn(4099, device=device)
    out = torch.empty_like(x)
    _axpb_kernel[(triton.cdiv(4099, 128),)](x, out, 4099, 2.0, 1, BLOCK=128)  # specialisation recorded
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        _axpb_kernel[(triton.cdiv(4099, 128),)](x, out, 4099, 2.0, 1, BLOCK=128)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.testing.assert_close(out, x * 2 + 1)


@pytest.mark.gpu
@pytest.mark.skipif(not COMPILED, reason="compiled kernels only")
def test_gpu_kernels_launch_inside_torch_compile(enabled):
    """torch.compile treats fusekit kernels as the Triton kernels they are (the subclass is a JITFunction).

    Every argument is passed: with SQUARE left to its default, torch 2.11's inductor reported a
    wrong argument count and its launcher failed (H200, session 7).
    """

    def scaled(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        _axpb_kernel[(triton.cdiv(n, 128),)](x, out, n, 3.0, 2, BLOCK=128, SQUARE=False)
        return out * 2

    compiled = torch.compile(scaled, fullgraph=True)
    for n in (1, 1000, 4099):
        x = torch.randn(n, device="cuda")
        torch.testing.assert_close(compiled(x), (x * 3 + 2) * 2)


def test_current_device_query_skips_torch_cuda_wrapper_only_for_torchs_own_query(monkeypatch):
    """The direct path asks torch's raw device query where the driver's is ``torch.cuda.current_device``,
    and keeps any other driver's query as it is."""
    raw = lambda: 0  # noqa: E731 - stands in for torch._C._cuda_getDevice
    monkeypatch.setattr(torch._C, "_cuda_getDevice", raw, raising=False)
    torch_driver = type("TorchDriver", (), {"get_current_device": staticmethod(torch.cuda.current_device)})()
    assert fast_launch._current_device(torch_driver) is raw

    def own_query():
        return 3

    other = type("OtherDriver", (), {"get_current_device": staticmethod(own_query)})()
    assert fast_launch._current_device(other) is own_query


@pytest.mark.gpu
@pytest.mark.skipif(not COMPILED, reason="compiled kernels only")
def test_gpu_prepared_launches_compute_and_replay_as_tritons(enabled, gen):
    seed, rng = _seeded(gen)
    device = torch.device("cuda")
    for step in range(40):
        dtype = rng.choice([torch.float32, torch.float16])
        n = rng.choice([1, 17, 1000, 4099])
        block = rng.choice([32, 128])
        x = torch.randn(n, device=device, dtype=dtype)
        out = torch.full_like(x, float("nan"))
        square = rng.random() < 0.5
        launch = fast_launch.prepare(_axpb_kernel, (triton.cdiv(n, block),), ("x_ptr", "out_ptr", "a"), n=n, b=1,
                                     BLOCK=block, SQUARE=square)
        for _ in range(3):
            a = rng.uniform(-2, 2)
            x.copy_(torch.randn_like(x))
            out.fill_(float("nan"))
            launch(x, out, a)
            torch.testing.assert_close(out.float(), _axpb(x, a, 1, square).float(), rtol=1e-2, atol=1e-2,
                                       msg=f"seed {seed} step {step}")
    x = torch.randn(4099, device=device)
    out = torch.empty_like(x)
    launch = fast_launch.prepare(_axpb_kernel, (triton.cdiv(4099, 128),), ("a",), x_ptr=x, out_ptr=out, n=4099, b=1,
                                 BLOCK=128)
    launch(2.0)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        launch(2.0)
    torch.cuda.current_stream().wait_stream(stream)
    x.copy_(torch.randn_like(x))
    out.fill_(float("nan"))
    graph.replay()
    torch.testing.assert_close(out, x * 2 + 1)
