"""Time the golden-matched decode kernels against vLLM's in one run, as JSON with provenance (GPU).

    python scripts/bench_decode.py --out bench_decode.json [--quick] [--sweep]
    python scripts/bench_decode.py --smoke --out /tmp/smoke.json     # CPU: the script's plumbing
    python scripts/bench_decode.py --table bench_decode.json          # its Markdown table

For each batch size (all rows active; default 1, 2, 4, ..., 1024), Qwen3-Next's TP1 heads
(H=16, HV=32, K=V=128, conv dim 8192, W=4) and an fp32 and a bf16 recurrent state, three ops
are timed, each arm on its own copy of the state:

* ``recurrent``: ``vllm`` is vLLM's ``fused_recurrent_gated_delta_rule_packed_decode``, ``ours``
  is ``kernels.recurrent.launch_recurrent`` (arguments checked once), ``ours_api`` the public
  ``kernels.recurrent_step``;
* ``conv``: ``vllm`` is vLLM's ``causal_conv1d_update`` (SiLU, no bias, a cache of the state
  dtype, bf16 x and weight), ``ours`` is ``kernels.conv.launch_conv``, ``ours_api`` the public
  ``kernels.conv_update``;
* ``decode_step``: the GDN decode step as vLLM serves it, ``vllm`` is ``causal_conv1d_update``
  then the packed decode on its output (vLLM's decode path), ``ours`` is
  ``kernels.serving.decode_step`` (what mode golden launches per layer), ``ours_api`` the public
  ``conv_update`` then ``recurrent_step``; the conv cache is bf16 (the model dtype, as vLLM
  allocates it), the recurrent state of the case's dtype.

The conv caches have vLLM's layout ``--conv-layout``: ``state-first`` ([blocks, W-1, dim], vLLM's
default, ``VLLM_SSM_CONV_STATE_LAYOUT`` unset or ``SD``; its ``_forward_core`` hands
``causal_conv1d_update`` the transposed view) or ``dim-first`` ([blocks, dim, W-1], ``DS``).

vLLM's kernels are called as vLLM's decode path calls them (harness/agreement.py). Arms
alternate within each of ROUNDS rounds; every arm is measured three ways per round, medians
over rounds reported:

* ``us``: ``triton.testing.do_bench``'s median (L2 flushed before each call, CUDA events);
* ``wall_us``: wall time per call of back-to-back calls, no flush (host perf_counter from a
  synchronized start to a synchronized end, over enough calls to last WALL_TARGET_MS): what
  a layer pays when the host launches faster than the device runs, or the launch cost when not;
* ``kernel_us``: device time of the kernels and copies one call launches (torch.profiler),
  calls back to back: a cache small enough stays in L2 from one call to the next;
* ``kernel_cold_us`` (vLLM's and our launch, ``COLD_ARMS``): the same with L2 flushed before
  each call (the flush's own kernel left out), as in an engine, where a layer's caches are
  evicted by the other layers before its next step. ``--flush rewrite`` (default) rewrites
  FLUSH_BYTES in place, so a call starts with L2 full of dirty lines to write back;
  ``--flush read`` reads them, so a call starts with L2 clean (the previous call's writes went
  back during the flush) and the writes it leaves in L2 go back after its end, as in an engine
  whose next kernels read weights.

An op's bytes (state read and written, inputs read, output written) over its ``us`` give its
achieved bandwidth, reported as a fraction of a device-to-device copy of the same number of bytes
timed in the same round, and of a 1 GiB copy. Ratios are vLLM's time / ours (>= 1.0: ours at least
as fast): ``speed_vs_vllm`` (do_bench), ``speed_vs_vllm_wall``, ``speed_vs_vllm_device``,
``speed_vs_vllm_device_cold``. ``api_bound`` compares the public functions' wall time with their
launch's (``ours_api`` vs ``ours``): within the bound when the API takes at most 1.25x the
launch's wall time at B >= 64 and at most 50 µs more below; its ``checks_us`` is the host time per
call of the public functions' checks alone as a repeated call makes them (the call key, the plan
lookup and the index tensor's kept verdict: ``kernels/call_plans.py``; nothing launched; median
over the rounds). ``summary`` lists the cases below 1.0 and the API bound's misses. ``--sweep``
also times the default and other launch shapes of the recurrent kernel
(``gdn_evidence/harness/launch_shapes.py``: splits of K, warps, value rows per thread, blocks of
value rows per program), ``--sweep conv`` (or ``recurrent,conv``) of the conv kernel (channels per
program, warps), from B = ``--sweep-from`` (default 64) up, in three rounds that each time every
shape once, medians fastest first, each with vLLM's time over it; ``--sweep-table`` prints them,
and per op and state dtype the one shape closest to the fastest at every swept batch size.
``--contracted`` also times, beside each recurrent case, our recurrent kernel at its default
launch shape compiled with contraction on (``launch_variant``; LLVM fuses each product into
the add it feeds: the K-sums' first level and the update), alternating with vLLM and ours in
VARIANT_ROUNDS rounds: what a golden with FMAs in those places could gain; not bitwise.
``--replay-step`` times, beside each decode step, the response-replay kernel with one token per row
(``kernels.replay.replay_tokens``: the conv and the recurrent step in one kernel, the conv state
written by a second) against vLLM's decode step and ours, with its bits compared with ours.
``--registers``, ``--prefetch``, ``--early-loads``, ``--l2-prefetch``, ``--output-store``,
``--block-order``, ``--full-lines``, ``--pipelined`` and ``--tma`` time those sets of VARIANTS
the same way: ptxas's register cap (``maxnreg``), ``harness/prefetch_kernel.py`` (the state two
blocks ahead in flight), ``harness/loads_ahead_kernel.py`` (every load that does not depend on
the state's block issued first; the state asked into L2 ahead, one bulk prefetch: a program's
whole range first, or blocks ahead in the loop; each block's outputs stored from the K-sum's
layout, not through shared memory), ``harness/block_order_kernel.py`` (a program's blocks from
block ``i_nh % CHUNKS`` on, so that neighbouring programs are not at the same block of their
heads), ours with each warp's load of the state covering whole 128-byte lines (8 lanes x 16
bytes of 4 value rows, where ours' split of K takes half lines of 8 rows with a 2-byte state),
``harness/pipelined_kernel.py`` (the loop over blocks software-pipelined by Triton, the next
blocks' state copied into shared memory asynchronously, at 2 to 4 stages) and
``harness/tma_kernel.py`` (that loop with the state's blocks read through a tensor descriptor:
the Tensor Memory Accelerator's bulk copies on sm_90), some also at other shapes, with ours
there;
``same_bits`` says whether each variant's output and state were bitwise ours after one call.
``--what-if`` also times, beside each recurrent case with a bf16 state,
``gdn_evidence/harness/what_if_kernel.py`` (ours with another K-sum order, without and with FMAs;
no golden has its bits) at the default launch shape's block of value rows and warps, one block
per program (it takes no blocks in turn): ``what_if`` holds its medians and vLLM's time over
each. Not with an fp32 state, where that kernel spills under Triton 3.9.0
(``scripts/sass_mix.py``).

The JSON is rewritten after every case, ``complete`` false until the last one ran, so that a
run cut short still leaves what it measured.

``--quick`` (3 rounds, shorter do_bench and profiles; ``--rounds`` sets their number) fits
one device call: 44 s on an H200 for the default sizes with ``--what-if`` (commit 67cd0fa; the
kernels' compiles included, vLLM's import not). ``--smoke`` runs the whole flow on CPU with
tiny heads, B = 2, our kernels in Triton's interpreter and the goldens standing in for vLLM's
kernels (named so in the report); it measures nothing and exists so that a test catches a
broken script.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path
import torch
import triton

from gdn_evidence.harness import launch_shapes
from gdn_evidence.harness.agreement import Providers, load_providers
from gdn_evidence.harness.block_order_kernel import block_order_kernel
from gdn_evidence.harness.layer import QWEN3_NEXT_DIMS, LayerDims
from gdn_evidence.harness.loads_ahead_kernel import l2_prefetch_kernel, loads_ahead_kernel
from gdn_evidence.harness.pipelined_kernel import (
    ONE_WARP_8_ROWS,
    PIPELINED,
    pipelined_kernel,
    variant_config,
)
from gdn_evidence.harness.pipelined_kernel import SHAPES as PIPELINED_SHAPES
from gdn_evidence.harness.prefetch_kernel import prefetch_two_kernel
from gdn_evidence.harness.profiling import Between, between, kernel_time
from gdn_evidence.harness.provenance import provenance
from gdn_evidence.harness.tma_kernel import TMA, tma_kernel
from gdn_evidence.harness.tma_kernel import allocate as tma_scratch
from gdn_evidence.harness.what_if_kernel import launch_grouped
from vllm_gdn_invariant import golden
from vllm_gdn_invariant.kernels import conv as conv_kernel
from vllm_gdn_invariant.kernels import conv_update, recurrent_step, serving
from vllm_gdn_invariant.kernels import recurrent as recurrent_kernel
from vllm_gdn_invariant.kernels.call_plans import CALL_PLANS
from vllm_gdn_invariant.kernels.replay import replay_tokens
from vllm_gdn_invariant.kernels.validation import (
    check_conv_args,
    check_recurrent_args,
)
from vllm_gdn_invariant.shadow.bits import same_bits

SCHEMA = "vllm-gdn-invariant/bench-decode/2"
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CONV_DEFAULTS = {"bias": None, "activation": "silu"}  # conv_update's
CONV_LAYOUTS = {"state-first": False, "dim-first": True}  # --conv-layout: dim_first
DEFAULT_CONV_LAYOUT = "state-first"  # vLLM's (VLLM_SSM_CONV_STATE_LAYOUT unset)
OPS = ("recurrent", "conv", "decode_step")
ARMS = ("vllm", "ours", "ours_api")
COLD_ARMS = ("vllm", "ours")  # the API launches ours' kernels: its flushed time adds nothing
PEAK_COPY_BYTES = 1 << 30
SWEEP_FROM_BATCH = 64
STATE_NAMES = {"float32": "fp32", "bfloat16": "bf16"}
API_RATIO_BOUND = 1.25  # API wall time over the launch's, from API_LARGE_BATCH rows
API_EXCESS_BOUND_US = 50.0  # API wall time minus the launch's, below API_LARGE_BATCH rows
API_LARGE_BATCH = 64
SMOKE_DIMS = LayerDims(1, 2, 16, 16)
SMOKE_BATCH_SIZES = (2,)


@dataclass(frozen=True)
class Settings:
    """How long each measurement runs."""

    rounds: int
    warmup_ms: int  # do_bench
    rep_ms: int  # do_bench
    profile_iters: int
    wall_target_ms: float
    wall_max_calls: int


FULL = Settings(rounds=7, warmup_ms=25, rep_ms=100, profile_iters=20, wall_target_ms=20.0,
                wall_max_calls=4000)  # fmt: skip
QUICK = Settings(rounds=3, warmup_ms=5, rep_ms=20, profile_iters=10, wall_target_ms=5.0,
                 wall_max_calls=1000)  # fmt: skip
SMOKE = Settings(rounds=1, warmup_ms=0, rep_ms=0, profile_iters=0, wall_target_ms=0.0,
                 wall_max_calls=1)  # fmt: skip


FLUSH_BYTES = 256 << 20  # written between profiled calls: 5x an H100's or H200's L2


FLUSHES = ("rewrite", "read")


class GpuClock:
    """Measurements on the current CUDA device; ``flush`` is how L2 is flushed before a call
    timed cold (FLUSHES)."""

    device = "cuda"
    timed = True

    def __init__(self, settings: Settings, flush: str = "rewrite"):
        if flush not in FLUSHES:
            raise ValueError(f"flush {flush!r}: one of {', '.join(FLUSHES)}")
        self.settings = settings
        self.flush_mode = flush

    def sync(self) -> None:
        torch.cuda.synchronize()

    def bench_us(self, fn: Callable[[], object]) -> float:
        """Median time of one call in microseconds (do_bench, L2 flushed)."""
        import triton.testing  # CUDA only: its benchmarker needs a driver

        ms = triton.testing.do_bench(
            fn, warmup=self.settings.warmup_ms, rep=self.settings.rep_ms, return_mode="median"
        )
        return ms * 1e3

    def device_us(self, fn: Callable[[], object]) -> float:
        return kernel_time(fn, self.settings.profile_iters).us

    @functools.cached_property
    def flush(self) -> Between:
        """FLUSH_BYTES of a buffer of its own rewritten (its bits inverted) in place, or read
        (summed into one value), as ``flush_mode`` says."""
        buffer = torch.zeros(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        if self.flush_mode == "read":
            return between(lambda: buffer.sum(dtype=torch.int64))
        return between(buffer.bitwise_not_)

    def device_cold_us(self, fn: Callable[[], object]) -> float:
        """``device_us`` with L2 flushed before each call (the flush not counted)."""
        return kernel_time(fn, self.settings.profile_iters, before=self.flush).us

    def copy_fn(self, num_bytes: int) -> Callable[[], object]:
        """A device-to-device copy that reads num_bytes / 2 and writes num_bytes / 2."""
        src = torch.empty(max(num_bytes // 2, 1), dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)


class SmokeClock(GpuClock):
    """CPU stand-in: one call per measurement, no device time; nothing here is a measurement."""

    device = "cpu"
    timed = False

    def sync(self) -> None:
        pass

    def bench_us(self, fn: Callable[[], object]) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6

    def device_us(self, fn: Callable[[], object]) -> float | None:
        return None

    def device_cold_us(self, fn: Callable[[], object]) -> float | None:
        return None


def wall_us(clock: GpuClock, fn: Callable[[], object], calls: int) -> float:
    """Wall time per call of ``calls`` back-to-back calls, from a synchronized start to a
    synchronized end."""
    clock.sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    clock.sync()
    return (time.perf_counter() - start) / calls * 1e6


CHECK_CALLS = 200  # calls per round timing the public functions' checks alone


def host_us(fn: Callable[[], object], calls: int) -> float:
    """Host time per call of ``calls`` calls of ``fn``, which launches nothing."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def wall_calls(settings: Settings, us: float) -> int:
    """Enough calls of about ``us`` each to last the wall target."""
    calls = int(settings.wall_target_ms * 1e3 / max(us, 1.0))
    return max(min(calls, settings.wall_max_calls), min(10, settings.wall_max_calls))


def inputs(
    dims: LayerDims,
    batch: int,
    state_dtype: torch.dtype,
    seed: int,
    device: str,
    dim_first: bool = False,
) -> dict:
    """One decode step's tensors: the recurrent step's, the conv update's (cache of the state
    dtype) and the decode step's conv cache (bf16); the conv caches [blocks, dim, W-1] when
    ``dim_first``, else [blocks, W-1, dim]."""
    H, HV, K, V = dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim
    dim, width = dims.conv_dim, dims.conv_width
    conv_shape = (batch + 1, dim, width - 1) if dim_first else (batch + 1, width - 1, dim)
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    return {
        "mixed_qkv": randn(batch, dim).bfloat16(),
        "a": randn(batch, HV).bfloat16(),
        "b": randn(batch, HV).bfloat16(),
        "A_log": torch.log(torch.rand(HV, generator=g, device=device) * 15.0 + 1.0),
        "dt_bias": randn(HV),
        "state": (randn(batch + 1, HV, V, K) * 0.1).to(state_dtype),
        "state_indices": torch.arange(1, batch + 1, dtype=torch.int32, device=device),
        "x": randn(batch, dim).bfloat16(),
        "conv_state": randn(*conv_shape).to(state_dtype),
        "step_conv_state": randn(*conv_shape).bfloat16(),
        "dim_first": dim_first,
        "weight": (randn(dim, width) * 0.5).bfloat16(),
        "H": H,
        "scale": K**-0.5,
    }


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def recurrent_bytes(x: dict) -> int:
    batch = x["mixed_qkv"].shape[0]
    out = batch * x["state"].shape[1] * x["state"].shape[2] * 2  # bf16 out [B, 1, HV, V]
    block = nbytes(x["state"][0])
    return 2 * batch * block + nbytes(x["mixed_qkv"], x["a"], x["b"]) + out


def conv_bytes(x: dict, cache: torch.Tensor) -> int:
    batch = x["x"].shape[0]
    return 2 * batch * nbytes(cache[0]) + 2 * nbytes(x["x"]) + nbytes(x["weight"])


def recurrent_checks(mixed_qkv, a, b, A_log, dt_bias, state, indices, **options) -> None:
    """What ``recurrent_step`` does before launching on a repeated call: the call key, the plan
    lookup, the index tensor's kept verdict."""
    key = recurrent_kernel.recurrent_call_key(
        mixed_qkv, a, b, A_log, dt_bias, state, indices, **options
    )
    CALL_PLANS.lookup(key, indices, num_blocks=state.shape[0])


def vllm_conv_view(conv_state: torch.Tensor, dim_first: bool) -> torch.Tensor:
    """The conv cache as vLLM's ``_forward_core`` hands it to ``causal_conv1d_update``:
    [blocks, dim, W-1], a transposed view of a state-first cache."""
    return conv_state if dim_first else conv_state.transpose(1, 2)


def conv_checks(x, conv_state, weight, indices, dim_first: bool) -> None:
    """What ``conv_update`` (no bias, SiLU) does before launching on a repeated call."""
    key = conv_kernel.conv_call_key(
        x, conv_state, weight, indices, **CONV_DEFAULTS, dim_first=dim_first
    )
    CALL_PLANS.lookup(key, indices, num_blocks=conv_state.shape[0])


def recurrent_arms(providers: Providers, x: dict, clock: GpuClock) -> dict:
    """vLLM's packed decode and ours (launch and API), each on its own copy of the state."""
    vllm_state, ours_state, api_state = (x["state"].clone() for _ in range(3))
    batch, HV, V = x["mixed_qkv"].shape[0], x["a"].shape[1], x["state"].shape[2]
    vllm_out = torch.empty(batch, 1, HV, V, dtype=torch.bfloat16, device=clock.device)
    gates = (x["mixed_qkv"], x["a"], x["b"], x["A_log"], x["dt_bias"])
    kwargs = {"num_k_heads": x["H"], "scale": x["scale"], "use_qk_l2norm": True}
    interpreted = recurrent_kernel.INTERPRETED
    dims = check_recurrent_args(
        *gates, ours_state, x["state_indices"], **kwargs, interpreted=interpreted
    )
    config = recurrent_kernel.recurrent_config(dims, x["state"].dtype)

    def vllm():
        providers.packed_decode(
            mixed_qkv=x["mixed_qkv"],
            a=x["a"],
            b=x["b"],
            A_log=x["A_log"],
            dt_bias=x["dt_bias"],
            scale=x["scale"],
            initial_state=vllm_state,
            out=vllm_out,
            ssm_state_indices=x["state_indices"],
            use_qk_l2norm_in_kernel=True,
        )

    def ours(config=config):
        recurrent_kernel.launch_recurrent(*gates, ours_state, x["state_indices"], dims, config)

    def ours_api():
        recurrent_step(*gates, api_state, x["state_indices"], **kwargs)

    def checks():
        recurrent_checks(*gates, api_state, x["state_indices"], **kwargs)

    return {
        "vllm": vllm,
        "ours": ours,
        "ours_api": ours_api,
        "_checks": checks,
        "_dims": dims,
        "_config": config,
    }


def conv_arms(providers: Providers, x: dict, clock: GpuClock) -> dict:
    vllm_state, ours_state, api_state = (x["conv_state"].clone() for _ in range(3))
    vllm_x = x["x"].clone()  # vLLM writes its output over x when x has the cache dtype
    dim_first = x["dim_first"]
    dims = check_conv_args(
        x["x"],
        ours_state,
        x["weight"],
        x["state_indices"],
        bias=None,
        activation="silu",
        dim_first=dim_first,
        interpreted=conv_kernel.INTERPRETED,
    )
    config = conv_kernel.conv_config(dims)

    def vllm():
        providers.conv_update(
            vllm_x,
            vllm_conv_view(vllm_state, dim_first),
            x["weight"],
            bias=None,
            activation="silu",
            conv_state_indices=x["state_indices"],
            validate_data=False,
        )

    def ours(config=config):
        conv_kernel.launch_conv(
            x["x"], ours_state, x["weight"], x["state_indices"], None, dims, config
        )

    def ours_api():
        conv_update(x["x"], api_state, x["weight"], x["state_indices"], dim_first=dim_first)

    def checks():
        conv_checks(x["x"], api_state, x["weight"], x["state_indices"], dim_first)

    return {"vllm": vllm, "ours": ours, "ours_api": ours_api, "_checks": checks, "_config": config}


def decode_step_arms(providers: Providers, x: dict, clock: GpuClock) -> dict:
    """The decode step: vLLM's conv update then packed decode, mode golden's decode_step, and
    the public functions; each arm on its own conv cache and state."""
    conv_states = [x["step_conv_state"].clone() for _ in range(3)]
    states = [x["state"].clone() for _ in range(3)]
    batch, HV, V = x["x"].shape[0], x["a"].shape[1], x["state"].shape[2]
    vllm_x = x["x"].clone()  # vLLM's conv writes its output over x (bf16 x, bf16 cache)
    vllm_out = torch.empty(batch, 1, HV, V, dtype=torch.bfloat16, device=clock.device)
    ours_out = torch.empty_like(vllm_out)  # mode golden writes vLLM's core_attn_out too
    indices, dim_first = x["state_indices"], x["dim_first"]
    gates = (x["a"], x["b"], x["A_log"], x["dt_bias"])

    def vllm():
        mixed_qkv = providers.conv_update(
            vllm_x,
            vllm_conv_view(conv_states[0], dim_first),
            x["weight"],
            bias=None,
            activation="silu",
            conv_state_indices=indices,
            validate_data=False,
        )
        providers.packed_decode(
            mixed_qkv=mixed_qkv,
            a=x["a"],
            b=x["b"],
            A_log=x["A_log"],
            dt_bias=x["dt_bias"],
            scale=x["scale"],
            initial_state=states[0],
            out=vllm_out,
            ssm_state_indices=indices,
            use_qk_l2norm_in_kernel=True,
        )

    def ours():
        serving.decode_step(
            x["x"], *gates, conv_states[1], x["weight"], None, states[1], indices,
            num_k_heads=x["H"], scale=x["scale"], dim_first=dim_first, out=ours_out,
        )  # fmt: skip

    def ours_api():
        mixed_qkv = conv_update(x["x"], conv_states[2], x["weight"], indices, dim_first=dim_first)
        recurrent_step(mixed_qkv, *gates, states[2], indices, num_k_heads=x["H"], scale=x["scale"])

    conv_out = x["x"].new_empty(x["x"].shape)  # what conv_update returns: checked, not read

    def checks():
        conv_checks(x["x"], conv_states[2], x["weight"], indices, dim_first)
        recurrent_checks(
            conv_out, *gates, states[2], indices, num_k_heads=x["H"], scale=x["scale"],
            use_qk_l2norm=True,
        )  # fmt: skip

    return {"vllm": vllm, "ours": ours, "ours_api": ours_api, "_checks": checks}


def api_bound(batch: int, api_wall: float, launch_wall: float, checks: float | None = None) -> dict:
    """The public functions' wall time against their launch's (module docstring), with the host
    time of their checks alone (``checks``)."""
    ratio, excess = api_wall / launch_wall, api_wall - launch_wall
    if batch >= API_LARGE_BATCH:
        bound, within = f"api_wall <= {API_RATIO_BOUND} * launch_wall", ratio <= API_RATIO_BOUND
    else:
        bound = f"api_wall - launch_wall <= {API_EXCESS_BOUND_US} us"
        within = excess <= API_EXCESS_BOUND_US
    return {
        "api_wall_us": round(api_wall, 2),
        "launch_wall_us": round(launch_wall, 2),
        "ratio": round(ratio, 3),
        "excess_us": round(excess, 2),
        "checks_us": None if checks is None else round(checks, 2),
        "bound": bound,
        "within": within,
    }


def median(samples: list[float | None]) -> float | None:
    return None if None in samples else statistics.median(samples)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def rounded(values: dict) -> dict:
    return {k: None if v is None else round(v, 2) for k, v in values.items()}


def rounded_rounds(series: dict) -> dict:
    """Each arm's times per round, rounded as ``rounded`` rounds a median."""
    return {name: [None if t is None else round(t, 2) for t in s] for name, s in series.items()}


def time_arms(
    arms: dict, batch: int, num_bytes: int, clock: GpuClock, settings: Settings, peak_copy
) -> dict:
    """ROUNDS rounds that alternate the arms (and a same-size copy): do_bench, wall time and
    device time of each; medians, bandwidths, ratios and the API bound."""
    fns = {name: fn for name, fn in arms.items() if not name.startswith("_")}
    fns["copy"] = clock.copy_fn(num_bytes)
    bench = {name: [] for name in fns}
    wall = {name: [] for name in fns}
    device = {name: [] for name in ARMS}
    cold = {name: [] for name in COLD_ARMS}
    checks: list[float] = []
    calls: dict[str, int] = {}
    for _ in range(settings.rounds):
        for name, fn in fns.items():
            bench[name].append(clock.bench_us(fn))
            calls.setdefault(name, wall_calls(settings, bench[name][0]))
            wall[name].append(wall_us(clock, fn, calls[name]))
            if name in device:
                device[name].append(clock.device_us(fn))
            if name in cold:
                cold[name].append(clock.device_cold_us(fn))
        if "_checks" in arms:
            checks.append(host_us(arms["_checks"], CHECK_CALLS))
    us = {name: statistics.median(s) for name, s in bench.items()}
    wall_med = {name: statistics.median(s) for name, s in wall.items()}
    kernel = {name: median(s) for name, s in device.items()}
    kernel_cold = {name: median(s) for name, s in cold.items()}
    peak_gbps = PEAK_COPY_BYTES / (clock.bench_us(peak_copy) * 1e3)
    return {
        "bytes": num_bytes,
        "us": rounded(us),
        "rounds_us": rounded_rounds(bench),
        "wall_us": rounded(wall_med),
        "wall_rounds_us": rounded_rounds(wall),
        "wall_calls": calls,
        "kernel_us": rounded(kernel),
        "kernel_rounds_us": rounded_rounds(device),
        "kernel_cold_us": rounded(kernel_cold),
        "kernel_cold_rounds_us": rounded_rounds(cold),
        "achieved_GBps": {name: round(num_bytes / (t * 1e3), 1) for name, t in us.items()},
        "peak_copy_GBps": round(peak_gbps, 1),
        "fraction_of_copy": {name: round(us["copy"] / us[name], 3) for name in ARMS},
        "fraction_of_peak_copy": {
            name: round(num_bytes / (us[name] * 1e3) / peak_gbps, 3) for name in ARMS
        },
        "speed_vs_vllm": ratio(us["vllm"], us["ours"]),
        "speed_vs_vllm_api": ratio(us["vllm"], us["ours_api"]),
        "speed_vs_vllm_wall": ratio(wall_med["vllm"], wall_med["ours"]),
        "speed_vs_vllm_device": ratio(kernel["vllm"], kernel["ours"]),
        "speed_vs_vllm_device_cold": ratio(kernel_cold["vllm"], kernel_cold["ours"]),
        "api_bound": api_bound(
            batch, wall_med["ours_api"], wall_med["ours"], median(checks) if checks else None
        ),
    }


SWEEP_ROUNDS = 3


def sweep_launch_shapes(arms: dict, configs: list, vllm_us: float, clock: GpuClock) -> list[dict]:
    """``arms["ours"]`` at its default launch shape and at each of ``configs``, in
    ``SWEEP_ROUNDS`` rounds that each time every shape once (do_bench); per shape the median
    over the rounds (``rounds_us`` keeps them), fastest first, each with ``vllm_us`` (the
    case's vLLM median) over it."""
    default = arms["_config"]
    shapes = [default, *(c for c in configs if c != default)]
    times: list[list[float]] = [[] for _ in shapes]
    for _ in range(SWEEP_ROUNDS):
        for config, measured in zip(shapes, times, strict=True):
            measured.append(clock.bench_us(lambda c=config: arms["ours"](c)))
    rows = []
    for config, measured in zip(shapes, times, strict=True):
        us = round(statistics.median(measured), 2)
        rows.append(
            {
                "config": config.__dict__,
                "default": config == default,
                "us": us,
                "rounds_us": [round(t, 2) for t in measured],
                "speed_vs_vllm": ratio(vllm_us, us),
            }
        )
    return sorted(rows, key=lambda r: r["us"])


def time_what_if(arms: dict, x: dict, vllm_us: float, clock: GpuClock) -> dict:
    """The what-if kernel without and with FMAs at the default launch shape (one block of value
    rows per program: it takes no blocks in turn), each on its own copy of the state: median
    of three do_bench times, and vLLM's time over each."""
    dims, config = arms["_dims"], arms["_config"]
    heads = {"H": dims.num_k_heads, "HV": dims.num_v_heads, "K": dims.head_k, "V": dims.head_v}
    gates = (x["mixed_qkv"], x["a"], x["b"], x["A_log"], x["dt_bias"])
    result = {}
    for name, fma in (("grouped", False), ("grouped_fma", True)):
        state = x["state"].clone()

        def run(state=state, fma=fma):
            launch_grouped(*gates, state, x["state_indices"], heads, config, fma)

        us = statistics.median(clock.bench_us(run) for _ in range(3))
        result[name] = {"us": round(us, 2), "speed_vs_vllm": ratio(vllm_us, us)}
    return result


VARIANT_ROUNDS = 5
# One warp of 8 value rows taking 8 or 16 blocks in turn (the pipelined set's "w1c16").
W1C8 = ONE_WARP_8_ROWS | {"chunks": 8}
W1C16 = PIPELINED_SHAPES["w1c16"]
FULL_LINES = {"row_elements": 16, "vector_bytes": 16}  # 8 lanes x 16 bytes along K
# (value rows per block, warps, blocks per program) of VARIANTS["full_lines"]
FULL_LINE_PROGRAMS = ((16, 2, 8), (8, 2, 16), (8, 1, 16), (16, 1, 8), (4, 1, 32), (32, 2, 4))
# loads_ahead_kernel's compile-time arguments
EARLY_LOADS = {"AHEAD": 0, "EARLY_LOADS": True, "OUT_AS_HELD": False}


def l2_ahead(blocks: int, out_as_held: bool = False) -> dict:
    """loads_ahead_kernel's compile-time arguments for the L2 prefetch ``blocks`` ahead (0:
    none), with the outputs stored as held or not."""
    return {"AHEAD": blocks, "EARLY_LOADS": False, "OUT_AS_HELD": out_as_held}


# Sets of variants of our recurrent kernel, name: (launch-shape fields replaced or None, compile
# options, kernel or None for ours).
VARIANTS = {
    "contracted": {"contracted": (None, {"enable_fp_fusion": True}, None)},
    # ptxas's register cap (.maxnreg) at the default launch shape and at one warp of 8 value
    # rows taking 8 blocks in turn: where ptxas places the next block's loads depends on it.
    "registers": {
        "maxnreg_168": (None, {"maxnreg": 168}, None),
        "maxnreg_255": (None, {"maxnreg": 255}, None),
        "w1c8": (W1C8, {}, None),
        "w1c8_maxnreg_168": (W1C8, {"maxnreg": 168}, None),
        "w1c8_maxnreg_255": (W1C8, {"maxnreg": 255}, None),
    },
    # The state two blocks ahead in flight (harness/prefetch_kernel.py), at the default shape
    # and at one warp of 8 value rows taking 16 blocks in turn (with ours at that shape).
    "prefetch": {
        "prefetch_two": (None, {}, prefetch_two_kernel),
        "w1c16": (W1C16, {}, None),
        "prefetch_two_w1c16": (W1C16, {}, prefetch_two_kernel),
    },
    # Every load that does not depend on the state's block issued first
    # (harness/loads_ahead_kernel.py), at the default shape.
    "early_loads": {"early_loads": (None, EARLY_LOADS, loads_ahead_kernel)},
    # The state asked into L2 ahead of its loads (harness/loads_ahead_kernel.py): a program's
    # whole range first, or 1 block ahead in the loop (344febd's package kernel) or 2 (also with
    # the early loads); at the default shape and at one warp of 8 value rows taking 8 or 16
    # blocks in turn (with ours).
    "l2_prefetch": {
        "l2_prefetch": (None, {}, l2_prefetch_kernel),
        "l2_ahead_1": (None, l2_ahead(1), loads_ahead_kernel),
        "l2_ahead_2": (None, l2_ahead(2), loads_ahead_kernel),
        "early_l2_ahead_2": (None, l2_ahead(2) | {"EARLY_LOADS": True}, loads_ahead_kernel),
        "w1c8": (W1C8, {}, None),
        "l2_prefetch_w1c8": (W1C8, {}, l2_prefetch_kernel),
        "w1c16": (W1C16, {}, None),
        "l2_prefetch_w1c16": (W1C16, {}, l2_prefetch_kernel),
        "l2_ahead_2_w1c16": (W1C16, l2_ahead(2), loads_ahead_kernel),
    },
    # Each block's outputs stored from the K-sum's layout (harness/loads_ahead_kernel.py's
    # OUT_AS_HELD) instead of through shared memory: ours with that store, at every shape, and
    # with it the L2 request one block ahead where a program takes several blocks.
    "output_store": {
        "out_as_held": (None, l2_ahead(0, out_as_held=True), loads_ahead_kernel),
        "out_as_held_l2_ahead_1": (None, l2_ahead(1, out_as_held=True), loads_ahead_kernel),
    },
    # A program's blocks taken from block i_nh % CHUNKS on, wrapping around
    # (harness/block_order_kernel.py), and that kernel in ours' order; at the default shape and
    # at one warp of 8 value rows taking 16 blocks in turn (with ours).
    "block_order": {
        "in_order": (None, {"ROTATE": False}, block_order_kernel),
        "rotated": (None, {"ROTATE": True}, block_order_kernel),
        "w1c16": (W1C16, {}, None),
        "rotated_w1c16": (W1C16, {"ROTATE": True}, block_order_kernel),
    },
    # The state's blocks read through a tensor descriptor (harness/tma_kernel.py: on sm_90 bulk
    # copies by the Tensor Memory Accelerator, STAGES - 1 blocks ahead from two stages), at the
    # default shape and at one warp of 8 value rows taking 16 blocks in turn (with ours).
    "tma": {
        "w1c16": (W1C16, {}, None),
        **{
            name: (fields, {"STAGES": stages}, tma_kernel) for name, (fields, stages) in TMA.items()
        },
    },
    # Ours with each warp's load of a slab covering whole 128-byte lines: 8 lanes x 16 bytes of
    # each of 4 value rows (ours' split covers half lines with a 2-byte state: 4 lanes x 16
    # bytes of 8 rows), at programs of a head's 128 value rows and of 32.
    "full_lines": {
        f"full_lines_w{warps}c{chunks}": (
            FULL_LINES | {"block_v": rows, "num_warps": warps, "chunks": chunks},
            {},
            None,
        )
        for rows, warps, chunks in FULL_LINE_PROGRAMS
    },
    # The loop over blocks software-pipelined by Triton (harness/pipelined_kernel.py: the next
    # blocks' state in flight as asynchronous copies into shared memory), with ours at the
    # variants' other shapes.
    "pipelined": {
        **{shape: (fields, {}, None) for shape, fields in PIPELINED_SHAPES.items()},
        **{
            name: (fields, {"STAGES": stages}, pipelined_kernel)
            for name, (fields, stages) in PIPELINED.items()
        },
    },
}


def launch_variant(
    gates: tuple, state, indices, dims, config, options: dict, kernel=None
) -> torch.Tensor:
    """``kernel`` (default: our recurrent kernel; another takes its arguments) at ``config``
    through Triton's JIT launcher with compile ``options`` (``enable_fp_fusion`` False unless
    given: with True, LLVM fuses products into the adds they feed, FMAs at the K-sums' first
    level and the update, not the goldens' bits; ``maxnreg`` caps ptxas's registers)."""
    out = torch.empty(
        (dims.batch, 1, dims.num_v_heads, dims.head_v), dtype=gates[0].dtype, device=state.device
    )
    grid, arguments, constexprs = recurrent_kernel.kernel_arguments(
        *gates, out, state, indices, dims, config
    )
    (kernel or recurrent_kernel.recurrent_step_kernel)[grid](
        *arguments,
        **constexprs,
        num_warps=config.num_warps,
        **({"enable_fp_fusion": False} | options),
    )
    return out


def takes_every_shape(kernel, options: dict) -> bool:
    """Ours, and loads_ahead_kernel without the L2 prefetch, take every launch shape; the
    other what-if kernels take whole blocks, two or more per program."""
    return kernel is None or (kernel is loads_ahead_kernel and options.get("AHEAD") == 0)


def whole_blocks(config, head_v: int) -> bool:
    """Two or more blocks per program, V a multiple of their rows."""
    return config.chunks >= 2 and head_v % (config.block_v * config.chunks) == 0


def time_alternating(fns: dict, clock: GpuClock) -> dict:
    """``fns`` (vLLM's first, under "vllm") alternating in VARIANT_ROUNDS rounds: medians of
    do_bench, device time and device time with L2 flushed, and vLLM's time over each other
    one's."""
    bench = {name: [] for name in fns}
    device = {name: [] for name in fns}
    cold = {name: [] for name in fns}
    for _ in range(VARIANT_ROUNDS):
        for name, fn in fns.items():
            bench[name].append(clock.bench_us(fn))
            device[name].append(clock.device_us(fn))
            cold[name].append(clock.device_cold_us(fn))
    us = {name: statistics.median(v) for name, v in bench.items()}
    kernel = {name: median(v) for name, v in device.items()}
    kernel_cold = {name: median(v) for name, v in cold.items()}
    timed = [name for name in fns if name != "vllm"]
    return {
        "us": rounded(us),
        "kernel_us": rounded(kernel),
        "speed_vs_vllm": {name: ratio(us["vllm"], us[name]) for name in timed},
        "speed_vs_vllm_device": {name: ratio(kernel["vllm"], kernel[name]) for name in timed},
        "kernel_cold_us": rounded(kernel_cold),
        "speed_vs_vllm_device_cold": {
            name: ratio(kernel_cold["vllm"], kernel_cold[name]) for name in timed
        },
    }


def time_variants(arms: dict, x: dict, clock: GpuClock, variants: dict) -> dict:
    """vLLM, ours and each variant of a VARIANTS set (``launch_variant``), alternating in
    VARIANT_ROUNDS rounds, each on its own copy of the state: medians of do_bench and device
    time, and vLLM's time over each; per variant whether one call's output and state are
    bitwise ours (``same_bits``)."""
    gates = (x["mixed_qkv"], x["a"], x["b"], x["A_log"], x["dt_bias"])
    fns = {"vllm": arms["vllm"], "ours": arms["ours"]}
    configs, bitwise = {}, {}
    reference_state = x["state"].clone()
    reference = recurrent_kernel.launch_recurrent(
        *gates, reference_state, x["state_indices"], arms["_dims"], arms["_config"]
    )[0]
    for name, (fields, options, kernel) in variants.items():
        dims = arms["_dims"]
        config = variant_config(arms["_config"], fields, dims.head_k, x["state"].dtype)
        config = dataclasses.replace(
            config, chunks=max(1, min(config.chunks, dims.head_v // config.block_v))
        )
        if not takes_every_shape(kernel, options) and not whole_blocks(config, dims.head_v):
            continue
        configs[name] = config.__dict__
        state = x["state"].clone()
        out = launch_variant(
            gates, state, x["state_indices"], arms["_dims"], config, options, kernel
        )
        bitwise[name] = same_bits(out, reference) and same_bits(state, reference_state)

        def run(state=state, config=config, options=options, kernel=kernel):
            launch_variant(gates, state, x["state_indices"], arms["_dims"], config, options, kernel)

        fns[name] = run
    return {"configs": configs, "same_bits": bitwise, **time_alternating(fns, clock)}


def time_replay_step(arms: dict, x: dict, clock: GpuClock) -> dict:
    """vLLM's decode step, ours (``serving.decode_step``) and the response-replay kernel with one
    token per row (``kernels.replay.replay_tokens``: conv and recurrent step in one kernel, the
    conv state written by a second), alternating in VARIANT_ROUNDS rounds, each on its own
    copies of the caches: medians of do_bench and device time, vLLM's time over each, and
    whether one replay call's output and both states were bitwise ours (``same_bits``)."""
    gates = (x["a"], x["b"], x["A_log"], x["dt_bias"])
    indices, batch = x["state_indices"], x["x"].shape[0]
    cu_seqlens = torch.arange(batch + 1, dtype=torch.int32, device=indices.device)
    options = {"num_k_heads": x["H"], "scale": x["scale"], "dim_first": x["dim_first"]}

    def replay(conv_state, state):
        return replay_tokens(
            x["x"], *gates, x["weight"], None, conv_state, indices, state, indices, cu_seqlens,
            **options,
        )  # fmt: skip

    caches = [(x["step_conv_state"].clone(), x["state"].clone()) for _ in range(3)]
    reference = serving.decode_step(
        x["x"], *gates, caches[0][0], x["weight"], None, caches[0][1], indices, **options
    )
    out = replay(*caches[1])
    same = (
        same_bits(out.view(reference.shape), reference)
        and same_bits(caches[1][0], caches[0][0])
        and same_bits(caches[1][1], caches[0][1])
    )
    fns = {
        "vllm": arms["vllm"],
        "ours": arms["ours"],
        "replay_one_token": lambda: replay(*caches[2]),
    }
    return {"same_bits": {"replay_one_token": same}, **time_alternating(fns, clock)}


def golden_packed_decode(
    *, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
    use_qk_l2norm_in_kernel,
):  # fmt: skip
    """--smoke's stand-in for vLLM's packed decode: the golden, written in place."""
    HV, V, K = initial_state.shape[1:]
    num_k_heads = (mixed_qkv.shape[1] - HV * V) // (2 * K)
    new_out, new_state = golden.recurrent_step(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, ssm_state_indices,
        num_k_heads=num_k_heads, scale=scale, use_qk_l2norm=use_qk_l2norm_in_kernel,
    )  # fmt: skip
    out.copy_(new_out)
    initial_state.copy_(new_state)
    return out, initial_state


def golden_conv_update(x, conv_state, weight, *, bias, activation, conv_state_indices, **_):
    """--smoke's stand-in for vLLM's causal_conv1d_update: the golden, written in place."""
    out, new_state = golden.conv_update(
        x, conv_state, weight, conv_state_indices, bias=bias, activation=activation
    )
    conv_state.copy_(new_state)
    return out


SMOKE_PROVIDERS = Providers(
    golden_packed_decode,
    golden_conv_update,
    "smoke stand-in: vllm_gdn_invariant.golden.recurrent_step",
    "smoke stand-in: vllm_gdn_invariant.golden.conv_update",
)


def summary(cases: list[dict]) -> dict:
    """The cases below 1.0 on each ratio and the API bound's misses."""
    below = {}
    for measure in (
        "speed_vs_vllm",
        "speed_vs_vllm_wall",
        "speed_vs_vllm_device",
        "speed_vs_vllm_device_cold",
    ):
        below[measure] = [
            {k: c[k] for k in ("op", "state_dtype", "batch", measure)}
            for c in cases
            if c.get(measure) is not None and c[measure] < 1.0
        ]
    misses = [
        {k: c[k] for k in ("op", "state_dtype", "batch")} | c["api_bound"]
        for c in cases
        if not c["api_bound"]["within"]
    ]
    return {"below_1": below, "api_bound_misses": misses, "cases": len(cases)}


def cell(value: float | None, spec: str) -> str:
    """A table cell: ``value`` formatted, "-" where it was not measured."""
    return "-" if value is None else format(value, spec)


def results_table(report: dict) -> str:
    """The Markdown table of a report: per case the three ratios (vLLM's time / ours), the
    device time with L2 flushed where the run measured it, the public functions' wall time over
    the launch's and the bound, and the what-if kernel's ratios where it ran."""
    cold = any("speed_vs_vllm_device_cold" in c for c in report["cases"])
    lines = [
        "| op | state | B | vLLM (µs) | ours (µs) | vLLM/ours | wall | device "
        + ("| device, L2 flushed " if cold else "")
        + "| API / launch | API bound | what-if | what-if FMA |",
        "| --- " * (12 + cold) + "|",
    ]

    for c in sorted(report["cases"], key=lambda c: (c["batch"], c["state_dtype"], c["op"])):
        what_if = c.get("what_if", {})
        cells = [
            c["op"],
            STATE_NAMES[c["state_dtype"]],
            str(c["batch"]),
            f"{c['us']['vllm']:.1f}",
            f"{c['us']['ours']:.1f}",
            f"{c['speed_vs_vllm']:.3f}",
            f"{c['speed_vs_vllm_wall']:.3f}",
            cell(c["speed_vs_vllm_device"], ".3f"),
            *([cell(c.get("speed_vs_vllm_device_cold"), ".3f")] if cold else []),
            f"{c['api_bound']['ratio']:.2f}",
            "within" if c["api_bound"]["within"] else "missed",
            f"{what_if['grouped']['speed_vs_vllm']:.3f}" if what_if else "-",
            f"{what_if['grouped_fma']['speed_vs_vllm']:.3f}" if what_if else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def variants_table(report: dict, key: str, cold: bool = False) -> str:
    """The Markdown table of a variants run (``--contracted``, ``--registers``, ``--prefetch``,
    ``--early-loads``, ``--l2-prefetch``, ``--pipelined``, ``--replay-step``): per case vLLM's
    device time (profiler) and vLLM's device time over ours and over each variant's ("-" where
    not timed); ``cold``: the device times with L2 flushed before each call."""
    measure, times = (
        ("speed_vs_vllm_device_cold", "kernel_cold_us")
        if cold
        else ("speed_vs_vllm_device", "kernel_us")
    )
    cases = [c for c in report["cases"] if key in c]
    arms = list(dict.fromkeys(arm for c in cases for arm in c[key][measure]))

    unit = "µs, device, L2 flushed" if cold else "µs, device"
    lines = [
        f"| state | B | vLLM ({unit}) | " + " | ".join(f"vLLM/{arm}" for arm in arms) + " |",
        "| --- | --- | --- |" + " --- |" * len(arms),
    ]
    for c in sorted(cases, key=lambda c: (c["state_dtype"], -c["batch"])):
        timed = c[key]
        cells = [
            STATE_NAMES[c["state_dtype"]],
            str(c["batch"]),
            cell(timed[times]["vllm"], ".1f"),
            *(cell(timed[measure].get(arm), ".3f") for arm in arms),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shape_text(config: dict) -> str:
    """A launch shape as the sweep tables write it: ``block_v=8, ..., num_warps=1``."""
    return ", ".join(f"{k}={v}" for k, v in config.items())


def sweep_table(report: dict) -> str:
    """Markdown tables of a report's sweeps: per case the default launch shape and the fastest
    one, each with vLLM's time over it; then per op and state dtype ``sweep_choices``."""
    lines = [
        "| op | state | B | vLLM (µs) | default (µs) | vLLM/default | fastest (µs) | vLLM/fastest "
        "| fastest shape |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in report["cases"]:
        if "sweep" not in c:
            continue
        default = next(r for r in c["sweep"] if r["default"])
        best = c["sweep"][0]
        shape = shape_text(best["config"])
        lines.append(
            f"| {c['op']} | {STATE_NAMES[c['state_dtype']]} | {c['batch']} | {c['us']['vllm']} "
            f"| {default['us']} | {default['speed_vs_vllm']:.3f} | {best['us']} "
            f"| {best['speed_vs_vllm']:.3f} | {shape} |"
        )
    lines += ["", "| op | state | one shape for every B | worst time / fastest | at B |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for (op, state), choice in sweep_choices(report).items():
        shape = shape_text(choice["config"])
        lines.append(
            f"| {op} | {STATE_NAMES[state]} | {shape} | {choice['worst']:.3f} "
            f"| {choice['worst_batch']} |"
        )
    return "\n".join(lines)


def sweep_choices(report: dict) -> dict[tuple[str, str], dict]:
    """Per op and state dtype, the launch shape that is closest to the fastest at every swept
    batch size: the one whose largest time over the fastest shape's time (``worst``, at
    ``worst_batch``) is smallest, among the shapes timed at every one of them."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for c in report["cases"]:
        if "sweep" in c:
            groups.setdefault((c["op"], c["state_dtype"]), []).append(c)
    choices = {}
    for key, cases in groups.items():
        relative: dict[str, dict[int, float]] = {}
        configs: dict[str, dict] = {}
        for c in cases:
            fastest = c["sweep"][0]["us"]
            for row in c["sweep"]:
                name = json.dumps(row["config"], sort_keys=True)
                configs[name] = row["config"]
                relative.setdefault(name, {})[c["batch"]] = row["us"] / fastest
        everywhere = {n: r for n, r in relative.items() if len(r) == len(cases)}
        name = min(everywhere, key=lambda n: (max(everywhere[n].values()), n))
        worst_batch = max(everywhere[name], key=everywhere[name].get)
        choices[key] = {
            "config": configs[name],
            "worst": everywhere[name][worst_batch],
            "worst_batch": worst_batch,
        }
    return choices


def reexec_interpreted(argv: list[str]) -> None:
    """--smoke runs our kernels in Triton's interpreter, which must be chosen before the kernels
    are imported: run this script again with TRITON_INTERPRET=1."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--table", type=Path, help="print the results table of this JSON file")
    parser.add_argument(
        "--sweep-table", type=Path, help="print the launch-shape sweep of this JSON file"
    )
    for key in (*VARIANTS, "replay_step"):
        parser.add_argument(
            f"--{key.replace('_', '-')}-table",
            type=Path,
            help=f"print the --{key.replace('_', '-')} timings of this JSON file",
        )
    parser.add_argument("--batch-sizes", default=None, help="comma-separated (default: all)")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated, of " + str(OPS))
    parser.add_argument(
        "--sweep",
        nargs="?",
        const="recurrent",
        default="",
        help="also time other launch shapes of these ops (recurrent, conv; default recurrent)",
    )
    parser.add_argument(
        "--sweep-from",
        type=int,
        default=SWEEP_FROM_BATCH,
        help=f"smallest batch size the sweep times (default {SWEEP_FROM_BATCH})",
    )
    parser.add_argument(
        "--what-if", action="store_true", help="also time the what-if kernel (module docstring)"
    )
    for key in VARIANTS:
        parser.add_argument(
            f"--{key.replace('_', '-')}",
            action="store_true",
            help=f"also time VARIANTS[{key!r}] (docstring)",
        )
    parser.add_argument(
        "--replay-step",
        action="store_true",
        help="also time the replay kernel with one token per row beside each decode step",
    )
    parser.add_argument(
        "--conv-layout",
        choices=tuple(CONV_LAYOUTS),
        default=DEFAULT_CONV_LAYOUT,
        help=f"the conv caches' layout (default {DEFAULT_CONV_LAYOUT}, vLLM's; module docstring)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    parser.add_argument(
        "--flush",
        choices=FLUSHES,
        default="rewrite",
        help="how L2 is flushed before each call timed cold: FLUSH_BYTES rewritten (default) or "
        "read (a call then starts with L2 clean, as in an engine)",
    )
    parser.add_argument("--rounds", type=int, help="rounds (default: 7, --quick 3)")
    parser.add_argument("--smoke", action="store_true", help="CPU check of the script")
    args = parser.parse_args(argv)
    if args.table is not None:
        print(results_table(json.loads(args.table.read_text())))
        return 0
    if args.sweep_table is not None:
        print(sweep_table(json.loads(args.sweep_table.read_text())))
        return 0
    for key in (*VARIANTS, "replay_step"):
        path = getattr(args, f"{key}_table")
        if path is not None:
            report = json.loads(path.read_text())
            print(variants_table(report, key))
            if any("kernel_cold_us" in c[key] for c in report["cases"] if key in c):
                print("\n" + variants_table(report, key, cold=True))
            return 0
    if args.out is None:
        parser.error("--out is required (or --table)")
    ops = tuple(args.ops.split(","))
    if set(ops) - set(OPS):
        parser.error(f"--ops takes {OPS}")
    sweep_ops = set(filter(None, args.sweep.split(",")))
    if sweep_ops - {"recurrent", "conv"}:
        parser.error("--sweep takes recurrent and conv")
    if args.tma:
        triton.set_allocator(tma_scratch)  # the descriptors tma_kernel makes on the device
    if args.smoke:
        if not recurrent_kernel.INTERPRETED:
            reexec_interpreted(sys.argv[1:] if argv is None else argv)
        settings, clock, dims, providers = SMOKE, SmokeClock(SMOKE), SMOKE_DIMS, SMOKE_PROVIDERS
        default_batches = SMOKE_BATCH_SIZES
    else:
        if not torch.cuda.is_available():
            print("bench_decode: CUDA is not available; nothing measured", file=sys.stderr)
            return 2
        try:
            providers = load_providers()
        except (ImportError, AttributeError) as error:
            print(f"bench_decode: vLLM's kernels are not available: {error}", file=sys.stderr)
            return 2
        settings = QUICK if args.quick else FULL
        if args.rounds is not None:
            if args.rounds < 1:
                parser.error("--rounds must be at least 1")
            settings = dataclasses.replace(settings, rounds=args.rounds)
        clock, dims = GpuClock(settings, args.flush), QWEN3_NEXT_DIMS
        default_batches = BATCH_SIZES
    batches = (
        tuple(int(b) for b in args.batch_sizes.split(",")) if args.batch_sizes else default_batches
    )
    peak_copy = clock.copy_fn(PEAK_COPY_BYTES if clock.timed else 1 << 10)

    def write(complete: bool) -> None:
        """The report of the cases so far (``complete`` once every case ran)."""
        report = {
            "schema": SCHEMA,
            "provenance": provenance(
                recurrent_provider=providers.recurrent_name,
                conv_provider=providers.conv_name,
                rounds=settings.rounds,
                mode="smoke" if args.smoke else "quick" if args.quick else "full",
                settings=settings.__dict__,
                seconds=round(time.perf_counter() - started, 1),
            ),
            "settings": {
                "batch_sizes": list(batches),
                "ops": list(ops),
                "dims": dims.__dict__,
                "conv_layout": args.conv_layout,
                "flush": args.flush,
                "inputs": "bf16 randn mixed_qkv/a/b/x/weight; A_log = log(U(1, 16)); "
                "state randn*0.1; conv cache randn (op conv: the state dtype; decode_step: "
                "bf16); all rows active; QK norm on; SiLU, no bias",
                "speed_vs_vllm": "vLLM median time / ours (launch; do_bench); >= 1.0: ours at "
                "least as fast. _wall: wall time per call of back-to-back calls; _device: "
                "profiler device time",
                "api_bound": f"ours_api wall <= {API_RATIO_BOUND} x ours wall at B >= "
                f"{API_LARGE_BATCH}; ours_api wall - ours wall <= {API_EXCESS_BOUND_US} us below",
            },
            "complete": complete,
            "summary": summary(cases),
            "cases": cases,
        }
        args.out.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")

    started = time.perf_counter()
    cases = []
    print(
        f"{'op':>11} {'state':>8} {'B':>5} {'vLLM us':>9} {'ours us':>9} {'api us':>9} "
        f"{'vLLM/ours':>9} {'wall':>6} {'device':>6} {'api/launch':>10} {'api ok':>6}"
    )
    for batch in batches:
        for dtype_name, state_dtype in STATE_DTYPES.items():
            x = inputs(
                dims,
                batch,
                state_dtype,
                seed=batch,
                device=clock.device,
                dim_first=CONV_LAYOUTS[args.conv_layout],
            )
            for op in ops:
                if op == "recurrent":
                    arms, num_bytes = recurrent_arms(providers, x, clock), recurrent_bytes(x)
                elif op == "conv":
                    arms = conv_arms(providers, x, clock)
                    num_bytes = conv_bytes(x, x["conv_state"])
                else:
                    arms = decode_step_arms(providers, x, clock)
                    num_bytes = recurrent_bytes(x) + conv_bytes(x, x["step_conv_state"])
                result = time_arms(arms, batch, num_bytes, clock, settings, peak_copy)
                case = {"op": op, "batch": batch, "state_dtype": dtype_name, **result}
                if op in sweep_ops and batch >= args.sweep_from:
                    configs = (
                        launch_shapes.recurrent_candidates(arms["_dims"], state_dtype)
                        if op == "recurrent"
                        else launch_shapes.conv_candidates()
                    )
                    case["sweep"] = sweep_launch_shapes(arms, configs, result["us"]["vllm"], clock)
                if op == "decode_step" and args.replay_step:
                    case["replay_step"] = time_replay_step(arms, x, clock)
                if op == "recurrent":
                    case["config"] = arms["_config"].__dict__
                    if args.what_if and state_dtype == torch.bfloat16:
                        case["what_if"] = time_what_if(arms, x, result["us"]["vllm"], clock)
                    for key, variants in VARIANTS.items():
                        if getattr(args, key):
                            case[key] = time_variants(arms, x, clock, variants)
                cases.append(case)
                write(False)  # what finished comes back if the run is cut short
                us, bound = result["us"], result["api_bound"]
                print(
                    f"{op:>11} {dtype_name:>8} {batch:>5} {us['vllm']:>9.1f} {us['ours']:>9.1f} "
                    f"{us['ours_api']:>9.1f} {result['speed_vs_vllm']:>9.3f} "
                    f"{result['speed_vs_vllm_wall']:>6.3f} "
                    f"{result['speed_vs_vllm_device'] or float('nan'):>6.3f} "
                    f"{bound['ratio']:>10.3f} {'yes' if bound['within'] else 'NO':>6}",
                    flush=True,
                )
                del arms
            del x
            if clock.timed:
                torch.cuda.empty_cache()
    write(True)
    print(f"bench_decode: wrote {args.out} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
