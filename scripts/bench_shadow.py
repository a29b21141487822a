"""The shadow checker's overhead on decode steps: shadow off, at rate 1/64 and at 1.0.

    python scripts/bench_shadow.py --out bench_shadow.json            # layer level (CUDA)
    python scripts/bench_shadow.py --engine --out bench_shadow.json   # vLLM's engine

Layer level (needs CUDA and vLLM's Triton kernels): a GDN layer of vLLM's class with Qwen3-Next
head counts (H=16, HV=32, K=V=128, harness/layer.py), decode-only steps of 64 and 256 rows,
fp32 and bf16 state, the routing patch and the shadow wrappers installed. Each step is one
``_forward_core`` call with its own forward context (so the sampler draws per step). Arms:
``off`` (vLLM's method under the routing patch, no wrapper), ``1/64`` and ``1`` (the wrapper
with a checker at that rate, default caps, reference golden, JSONL written, metrics
exported). ``ROUNDS`` rounds alternate the arms; each times ``--steps`` steps between device
synchronizations; the median over rounds of the mean step time is reported, with the ratio to
``off``. It also reports the device memory a checked step adds (peak minus before) and
where a checked step's time goes, against an unchecked one (``profile``: torch.profiler's
host wall time, device kernel time and launches, host-device synchronizations, the ops with
most self time), the serving thread's time to launch a step per arm (``host_launch_us``: what
a checked layer adds to a host-bound engine) and the Python functions with most own time in a
checked step (``checked_step_python_us``, cProfile).

Engine level (``--engine``): vLLM's ``LLM`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
with the plugin and the shadow checker on, on a model folder (default: the engine benchmarks'
Qwen3-Next of 8 layers with Qwen3-Next's GDN head counts, ``BENCH_QWEN3_NEXT``, dummy
weights), ``--batch`` one-word prompts decoding ``--max-tokens`` tokens; rounds alternate
the arms by taking the shadow wrappers off and putting them back with a checker of that
rate. The step time is the round's wall time over the tokens per request. CUDA graphs:
decode-only steps in FULL graphs never run the Python hook, so the engine runs with
``cudagraph_mode=PIECEWISE`` (``--eager``: no graphs). After the rounds, one more ``generate``
with shadow off and one at 1.0 run under cProfile (``step_python_us``: the serving thread's
Python time per step by function), and one of each under torch.profiler (``step_profile``:
host wall and device kernel time per step, the ops with most self time).

Compare level (``--compare``): the statistics of one checked layer's three fields (64 rows,
Qwen3-Next heads, fp32 and bf16 state) by compare.py's torch ops against compare_kernel.py's
one pass, rounds alternating, with their host transfer; both must give the same statistics.

Writes JSON with provenance (harness/provenance.py) and prints the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import checkout  # noqa: F401 - this checkout first on sys.path
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from gdn_evidence.e2e.engine_options import (
    add_engine_arguments,
    engine_options,
)
from gdn_evidence.e2e.plugin_site import (
    PLUGIN,
    installed_entry_point,
    plugin_site,
)
from gdn_evidence.harness.provenance import provenance
from gdn_evidence.harness.shadow_records import group_checks
from vllm_gdn_invariant.models.tiny import BENCH_QWEN3_NEXT, words, write_tiny_model
from vllm_gdn_invariant.shadow import checker as checker_module
from vllm_gdn_invariant.shadow import compare as compare_module
from vllm_gdn_invariant.shadow.config import parse_shadow
from vllm_gdn_invariant.shadow.metrics import ShadowMetrics
from vllm_gdn_invariant.shadow.record import read_records

ARMS = ("off", "1/64", "1")
CUDA = torch.device("cuda")
ROUNDS = 5
LAYER_CASES = [
    (64, torch.float32),
    (256, torch.float32),
    (64, torch.bfloat16),
    (256, torch.bfloat16),
]


def make_checker(
    rate: str, folder: Path, golden_impl: str = "auto"
) -> checker_module.ShadowChecker:
    config = parse_shadow(
        f"{rate},ref=golden,golden_impl={golden_impl},"
        f"out={folder}/bench_shadow_{rate.replace('/', '_')}.jsonl"
    )
    return checker_module.ShadowChecker(config, "route", metrics=ShadowMetrics(str(folder)))


def finish(checker: checker_module.ShadowChecker | None) -> None:
    """Wait for the checks still finishing on the checker's thread: inside the timed window,
    so an arm pays for all of its checks."""
    if checker is not None:
        checker.drain()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def step_probability(rate: float, decode_rows: int, max_rows: int) -> float:
    """The chance that a step is checked (shadow/sampling.py)."""
    group = min(max_rows, decode_rows)
    return min(1.0, rate * decode_rows / group)


def summarize(samples: dict[str, list[float]], decode_rows: int, max_rows: int) -> dict:
    """Medians over rounds, their ratios to off, and the ratio at 1/64 derived from the 1.0
    arm: at 1/64 a step is checked with probability p and then costs what a step at 1.0
    costs (both check the same number of rows), so 1 + p * (ratio at 1.0 - 1). The measured
    1/64 arm sees few checked steps per round; the derived figure has no sampling noise."""
    medians = {arm: statistics.median(v) for arm, v in samples.items()}
    ratios = {arm: medians[arm] / medians["off"] for arm in samples}
    p = step_probability(1 / 64, decode_rows, max_rows)
    return {
        "step_us": {arm: round(m, 1) for arm, m in medians.items()},
        "rounds_us": {arm: [round(x, 1) for x in v] for arm, v in samples.items()},
        "ratio_to_off": {arm: round(r, 4) for arm, r in ratios.items()},
        "checked_step_probability_at_1/64": round(p, 5),
        "ratio_at_1/64_derived_from_1": round(1 + p * (ratios["1"] - 1), 4),
    }


# layer level


def bench_layer_case(
    decodes: int,
    state_dtype: torch.dtype,
    steps: int,
    folder: Path,
    device: torch.device = CUDA,
    dims: object = None,
    golden_impl: str = "auto",
) -> dict:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen

    from gdn_evidence.harness.layer import (
        PREFIX,
        QWEN3_NEXT_DIMS,
        build_metadata,
        make_layer,
        make_layer_state,
        make_vllm_config,
        step_inputs,
        step_requests,
    )
    from vllm_gdn_invariant.patches import routed_forward_core

    dims = QWEN3_NEXT_DIMS if dims is None else dims
    vllm_config = make_vllm_config(dims, state_dtype)
    g = torch.Generator().manual_seed(decodes)
    requests = step_requests(decodes, [], False)
    state = make_layer_state(dims, state_dtype, decodes + 2, device, g)
    x, b, a = step_inputs(dims, decodes, device, g)
    layer = make_layer(vllm_config, dims, state, gqa_interleaved_layout=True)
    meta = build_metadata(vllm_config, requests, device)
    out = torch.empty(
        decodes, dims.num_v_heads, dims.head_v_dim, dtype=torch.bfloat16, device=device
    )
    wrapper = type(layer).__dict__["_forward_core"]
    served = wrapper.__wrapped__
    checkers = {arm: make_checker(arm, folder, golden_impl) for arm in ARMS if arm != "off"}

    def context():
        return types.SimpleNamespace(attn_metadata={PREFIX: meta})

    host_samples = {arm: [] for arm in ARMS}

    def run(arm: str) -> float:
        function = served if arm == "off" else wrapper
        checker_module.install(checkers.get(arm))
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            function(layer, mixed_qkv=x, b=b, a=a, core_attn_out=out)
        host_samples[arm].append((time.perf_counter() - start) / steps * 1e6)
        finish(checkers.get(arm))
        sync()
        return (time.perf_counter() - start) / steps * 1e6

    with (
        set_current_vllm_config(vllm_config),
        # plain functions, not mocks: a mock's call costs microseconds the engine does not pay
        mock.patch.object(qwen, "get_forward_context", context),
        mock.patch.object(routed_forward_core, "get_forward_context", context),
    ):
        for arm in ARMS:  # warm up: Triton compiles, the goldens' first launches
            run(arm)
        samples = {arm: [] for arm in ARMS}
        for arm in ARMS:
            host_samples[arm].clear()
        for _ in range(ROUNDS):
            for arm in ARMS:
                samples[arm].append(run(arm))
        checker = make_checker("1", folder, golden_impl)
        checker_module.install(checker)
        sync()
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if cuda else 0
        wrapper(layer, mixed_qkv=x, b=b, a=a, core_attn_out=out)
        finish(checker)
        sync()
        peak_extra = torch.cuda.max_memory_allocated() - before if cuda else None
        snapshot = checker.stats.max_snapshot_bytes
        checked_profile = profile_step(
            lambda: (wrapper(layer, mixed_qkv=x, b=b, a=a, core_attn_out=out), finish(checker))
        )
        unchecked_profile = profile_step(
            lambda: served(layer, mixed_qkv=x, b=b, a=a, core_attn_out=out)
        )
        python_profile = profile_python(
            lambda: wrapper(layer, mixed_qkv=x, b=b, a=a, core_attn_out=out), steps, steps
        )
        finish(checker)
        sync()
        stages = stage_host_us(
            checker, lambda: wrapper(layer, mixed_qkv=x, b=b, a=a, core_attn_out=out), steps
        )
    checker_module.install(None)
    for owned in (*checkers.values(), checker):
        owned.close()
    result = {
        "level": "layer",
        "decodes": decodes,
        "state_dtype": str(state_dtype).removeprefix("torch."),
        "steps_per_round": steps,
        "rows_checked_at_1": min(decodes, checkers["1"].config.max_rows),
        "golden_impl": golden_impl,
        "checks_by_reference_impl": {
            arm: dict(c.stats.reference_impls) for arm, c in checkers.items()
        },
        "sampled_steps": {arm: c.sampler.sampled_steps for arm, c in checkers.items()},
        "steps_drawn": {arm: c.sampler.steps for arm, c in checkers.items()},
        "checked_step_extra_device_bytes": peak_extra,
        "checked_step_snapshot_bytes": snapshot,
        "profile": {"checked_step": checked_profile, "unchecked_step": unchecked_profile},
        # the serving thread's time to launch a step (no waiting for the device): what a
        # checked layer adds to a host-bound engine's step
        "host_launch_us": {arm: round(statistics.median(v), 1) for arm, v in host_samples.items()},
        "checked_step_python_us": python_profile,
        "checked_step_stage_host_us": stages,
        **summarize(samples, decodes, checkers["1"].config.max_rows),
    }
    return result


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def profile_step(step: Callable[[], object], top: int = 8, units: int = 1) -> dict:
    """Where one call's time goes (torch.profiler): host wall time, device kernel time,
    kernel launches, host-device synchronizations, and the ops with most self time; all per
    unit (``units`` steps in the call)."""
    sync()
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    )
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        step()
        sync()
        wall_us = (time.perf_counter() - start) * 1e6
    events = prof.events()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    table = prof.key_averages()
    by_device = sorted(table, key=lambda e: -e.self_device_time_total)[:top]
    by_host = sorted(table, key=lambda e: -e.self_cpu_time_total)[:top]
    return {
        "host_wall_us": round(wall_us / units, 1),
        "device_kernel_us": round(sum(e.time_range.elapsed_us() for e in kernels) / units, 1),
        "device_kernels": round(len(kernels) / units, 1),
        "host_syncs": round(sum(1 for e in events if e.name in SYNC_CALLS) / units, 2),
        "device_to_host_copies": round(
            sum(1 for e in events if e.name.startswith("Memcpy DtoH") or "DtoH" in e.name) / units,
            2,
        ),
        "top_device_ops_us": {
            e.key[:80]: round(e.self_device_time_total / units, 1) for e in by_device
        },
        "top_host_ops_us": {e.key[:80]: round(e.self_cpu_time_total / units, 1) for e in by_host},
    }


def profile_python(step: Callable[[], object], calls: int, units: int, top: int = 16) -> dict:
    """Where the serving thread's Python time goes over ``calls`` calls of ``step`` (cProfile,
    which slows every call: the shares matter, not the sums), in microseconds per unit (a
    step): the functions with most own time, and this package's functions with most
    cumulative time."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        step()
    profiler.disable()
    table = pstats.Stats(profiler).stats  # {(file, line, name): (calls, _, own, cumulative, _)}

    def name(key: tuple) -> str:
        file, line, function = key
        return f"{Path(file).name}:{line}({function})"

    def ranked(column: int, keys) -> dict:
        chosen = sorted(keys, key=lambda key: -table[key][column])[:top]
        return {name(key): round(table[key][column] / units * 1e6, 1) for key in chosen}

    ours = [key for key in table if "vllm_gdn_invariant" in key[0]]
    return {"own_us": ranked(2, table), "package_cumulative_us": ranked(3, ours)}


def stage_host_us(
    checker: checker_module.ShadowChecker, step: Callable[[], object], steps: int
) -> dict[str, float]:
    """Host wall time per checked step of each stage of a check (no profiler): the snapshot
    (``prepare``: probe, draw, site, the copy), the reference, the compare's launches and its
    transfer, and the record and metrics (``complete``); each stage timed around its call, on
    whatever thread runs it."""
    totals: dict[str, float] = {}

    def timed(name: str, function: Callable) -> Callable:
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                totals[name] = totals.get(name, 0.0) + time.perf_counter() - start

        return call

    fields_stats = timed("compare launches", compare_module.all_device_stats)

    def start(pairs, valid=None):
        return compare_module.start(pairs, valid, fields_stats=fields_stats)

    cls = checker_module.ShadowChecker
    with contextlib.ExitStack() as stack:
        for owner, name, label in (
            (cls, "prepare", "snapshot"),
            (cls, "complete", "record and metrics"),
            (checker_module, "golden_kernels_reference", "reference"),
            (checker_module, "golden_reference", "reference"),
        ):
            stack.enter_context(mock.patch.object(owner, name, timed(label, getattr(owner, name))))
        stack.enter_context(mock.patch.object(checker_module, "start", timed("compare", start)))
        checker_module.install(checker)
        sync()
        begin = time.perf_counter()
        for _ in range(steps):
            step()
        totals["step (serving thread)"] = time.perf_counter() - begin
        finish(checker)
        sync()
    return {name: round(total / steps * 1e6, 1) for name, total in totals.items()}


def bench_layer(args: argparse.Namespace, folder: Path) -> list[dict]:
    from vllm_gdn_invariant.patches import applied, routing_patch
    from vllm_gdn_invariant.patches.shadow import shadow_patches
    from vllm_gdn_invariant.shadow import metrics

    if not torch.cuda.is_available():
        raise SystemExit("bench_shadow: the layer level needs CUDA (or use --engine)")
    results = []
    with contextlib.ExitStack() as stack:
        with mock.patch.object(metrics, "setup_process", lambda: None):
            stack.enter_context(applied([routing_patch(), *shadow_patches()]))
        for decodes, state_dtype in LAYER_CASES:
            results.append(
                bench_layer_case(
                    decodes, state_dtype, args.steps, folder, golden_impl=args.golden_impl
                )
            )
            print_result(results[-1])
    return results


# engine level


def bench_engine(args: argparse.Namespace, folder: Path) -> list[dict]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the model runs in this process
    os.environ["VLLM_PLUGINS"] = PLUGIN
    os.environ["VLLM_GDN_INVARIANT_SHADOW"] = (
        f"1,ref=golden,golden_impl={args.golden_impl},out={folder}/engine.jsonl"
    )
    if not installed_entry_point():  # the project on PYTHONPATH only: declare its entry point
        sys.path.insert(0, str(plugin_site(folder / "plugin-site")))
    from vllm import LLM, SamplingParams

    from vllm_gdn_invariant.plugin.entry import registered_status

    model = args.model or str(write_tiny_model(folder / "model", **BENCH_QWEN3_NEXT))
    options = (
        {"enforce_eager": True}
        if args.eager
        else {"compilation_config": {"cudagraph_mode": "PIECEWISE"}}
    )
    llm = LLM(
        model=model,
        load_format="dummy",
        max_model_len=args.max_tokens + 16,
        max_num_seqs=args.batch,
        enable_prefix_caching=False,
        seed=0,
        **options,
        **engine_options(
            args.attention_backend,
            args.prefill_backend,
            args.gpu_memory_utilization,
            args.kv_cache_gib,
        ),
    )
    status = registered_status()
    wrappers = [p for p in status.patches if p.name.endswith("(shadow)")]
    assert status.applied and wrappers, status.summary()
    prompts = [words(1, start=i) for i in range(args.batch)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    checkers = {arm: make_checker(arm, folder, args.golden_impl) for arm in ARMS if arm != "off"}

    def run(arm: str) -> float:
        for patch in wrappers:
            if arm == "off" and patch.applied:
                patch.revert()
            elif arm != "off" and not patch.applied:
                patch.apply()
        checker_module.install(checkers.get(arm))
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        finish(checkers.get(arm))
        return (time.perf_counter() - start) / args.max_tokens * 1e6

    for arm in ARMS:
        run(arm)  # warm up
    samples = {arm: [] for arm in ARMS}
    for _ in range(ROUNDS):
        for arm in ARMS:
            samples[arm].append(run(arm))
    path = checkers["1"].writer.path
    result = {
        "level": "engine",
        "model": model if args.model else {"BENCH_QWEN3_NEXT": BENCH_QWEN3_NEXT},
        "batch": args.batch,
        "max_tokens": args.max_tokens,
        "cuda_graphs": "none (enforce_eager)" if args.eager else "PIECEWISE",
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "sampled_steps": {arm: c.sampler.sampled_steps for arm, c in checkers.items()},
        "steps_drawn": {arm: c.sampler.steps for arm, c in checkers.items()},
        "golden_impl": args.golden_impl,
        "checks_by_reference_impl": {
            arm: dict(c.stats.reference_impls) for arm, c in checkers.items()
        },
        # what the timed checks found: vLLM's conv update is the goldens' bit for bit, so
        # its field differs nowhere
        "check_groups": group_checks(read_records(path) if path.exists() else []),
        "failures": {arm: dict(c.stats.failures) for arm, c in checkers.items()},
        **summarize(samples, args.batch, checkers["1"].config.max_rows),
    }
    # after the timed rounds and their records: one generate per arm under cProfile, one
    # under torch.profiler (per step: is the host or the device the bottleneck)
    try:
        result["step_python_us"] = {
            arm: profile_python(lambda arm=arm: run(arm), 1, args.max_tokens)
            for arm in ("off", "1")
        }
        result["step_profile"] = {
            arm: profile_step(lambda arm=arm: run(arm), top=12, units=args.max_tokens)
            for arm in ("off", "1")
        }
    except Exception as exc:  # noqa: BLE001 - the timed rounds stand without the profiles
        result["profile_error"] = repr(exc)
    checker_module.install(None)
    for checker in checkers.values():
        checker.close()
    print_result(result)
    return [result]


# the compare alone


def check_fields(state_dtype: torch.dtype, rows: int = 64) -> dict[str, tuple]:
    """Served and reference fields of one checked layer (Qwen3-Next heads): a few elements of
    each apart, as in a check against another provider."""
    from gdn_evidence.harness.layer import QWEN3_NEXT_DIMS as d

    g = torch.Generator(device=CUDA).manual_seed(rows)
    conv_dim = 2 * d.num_k_heads * d.head_k_dim + d.num_v_heads * d.head_v_dim
    shapes = {
        "output": ((rows, d.num_v_heads, d.head_v_dim), torch.bfloat16),
        "recurrent_state": ((rows, d.num_v_heads, d.head_v_dim, d.head_k_dim), state_dtype),
        "conv_state": ((rows, conv_dim, 3), torch.bfloat16),
    }
    fields = {}
    for name, (shape, dtype) in shapes.items():
        reference = torch.randn(shape, generator=g, device=CUDA).to(dtype)
        served = reference.clone()
        served.view(-1)[::97] *= 1.0001
        fields[name] = (served, reference)
    return fields


def bench_compare(args: argparse.Namespace) -> list[dict]:
    """compare.py's statistics for one checked layer: the torch ops against the one-pass
    kernel (compare_kernel.py), rounds alternating, each timing ``--steps`` checks' compares
    with their host transfer; the two must give the same statistics."""
    from vllm_gdn_invariant.shadow.compare import all_device_stats, all_torch_stats, summarize

    if not torch.cuda.is_available():
        raise SystemExit("bench_shadow: --compare needs CUDA")
    results = []
    for state_dtype in (torch.float32, torch.bfloat16):
        fields = check_fields(state_dtype)
        arms = {"torch": all_torch_stats, "fused": all_device_stats}

        def run(stats, fields: dict = fields) -> tuple[float, dict]:
            sync()
            start = time.perf_counter()
            for _ in range(args.steps):
                values = summarize(fields, fields_stats=stats)
            return (time.perf_counter() - start) / args.steps * 1e6, values

        answers = {arm: run(fn)[1] for arm, fn in arms.items()}  # warm-up: compiles
        samples = {arm: [] for arm in arms}
        for _ in range(ROUNDS):
            for arm, fn in arms.items():
                samples[arm].append(run(fn)[0])
        medians = {arm: statistics.median(v) for arm, v in samples.items()}
        result = {
            "level": "compare",
            "state_dtype": str(state_dtype).removeprefix("torch."),
            "rows": 64,
            "same_statistics": answers["torch"] == answers["fused"],
            "us": {arm: round(m, 1) for arm, m in medians.items()},
            "rounds_us": {arm: [round(x, 1) for x in v] for arm, v in samples.items()},
            "fused_speedup": round(medians["torch"] / medians["fused"], 2),
        }
        results.append(result)
        print(
            f"compare, 64 rows, {result['state_dtype']} state: torch {result['us']['torch']}us "
            f"fused {result['us']['fused']}us ({result['fused_speedup']}x), same statistics: "
            f"{result['same_statistics']}",
            flush=True,
        )
    return results


def print_result(r: dict) -> None:
    what = (
        f"layer {r['decodes']} rows {r['state_dtype']}"
        if r["level"] == "layer"
        else f"engine batch {r['batch']}"
    )
    steps = " ".join(f"{arm}={us}us" for arm, us in r["step_us"].items())
    ratios = " ".join(f"{arm}: {x}" for arm, x in r["ratio_to_off"].items() if arm != "off")
    derived = r["ratio_at_1/64_derived_from_1"]
    print(f"{what:<28} {steps}  ratio to off: {ratios} (1/64 from 1: {derived})", flush=True)
    if "host_launch_us" in r:
        launch = " ".join(f"{arm}={us}us" for arm, us in r["host_launch_us"].items())
        print(f"{'':<28} host launch per step: {launch}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument("--engine", action="store_true", help="measure in vLLM's engine")
    parser.add_argument(
        "--compare", action="store_true", help="time a check's compare alone: torch ops vs one pass"
    )
    parser.add_argument("--steps", type=int, default=256, help="layer: steps per round and arm")
    parser.add_argument("--model", help="engine: a model folder (dummy weights)")
    parser.add_argument("--batch", type=int, default=64, help="engine: requests per round")
    parser.add_argument("--max-tokens", type=int, default=128, help="engine: tokens per request")
    parser.add_argument("--eager", action="store_true", help="engine: no CUDA graphs")
    parser.add_argument(
        "--golden-impl",
        choices=("auto", "torch"),
        default="auto",
        help="the checkers' golden_impl (auto: the golden kernels on CUDA; torch: the goldens)",
    )
    add_engine_arguments(parser, gpu_memory_utilization=0.2)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="bench_shadow_"))
    if args.compare:
        results = bench_compare(args)
    elif args.engine:
        results = bench_engine(args, folder)
    else:
        results = bench_layer(args, folder)
    args.out.write_text(
        json.dumps(
            {"provenance": provenance(arms=list(ARMS), rounds=ROUNDS), "results": results}, indent=1
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
