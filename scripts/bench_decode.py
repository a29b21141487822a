"""Time the golden-matched decode kernels against vLLM's in one run, as JSON with provenance (GPU).

    python scripts/bench_decode.py --out bench_decode.json [--sweep]

For each batch size (all rows active; default 1, 16, 64, 256, 1024), Qwen3-Next's TP1 heads
(H=16, HV=32, K=V=128, conv dim 8192, W=4) and an fp32 and a bf16 state, two ops are timed,
each arm on its own copy of the state:

* ``recurrent``: ``vllm`` is vLLM's ``fused_recurrent_gated_delta_rule_packed_decode``, ``ours``
  is ``kernels.recurrent.launch_recurrent`` (arguments checked once);
* ``conv``: ``vllm`` is vLLM's ``causal_conv1d_update`` (SiLU, no bias, dim-first cache of the
  state dtype, bf16 x and weight), ``ours`` is ``kernels.conv.launch_conv``.

vLLM's kernels are called as vLLM's decode path calls them (harness/agreement.py). Ours are
timed at their launch, since vLLM's wrappers make no device syncs and ours validate the indices
on the device (``torch.unique``, ``any()``); the public functions, validation included, are
timed too (``ours_*_api``). Each arm's time is the median of ``triton.testing.do_bench``
medians (L2 flushed before each call) over ROUNDS rounds that alternate the arms; the device
time of the launched kernels (torch.profiler) is reported beside it. An op's bytes (state read
and written, inputs read, output written) over its time give its achieved bandwidth, reported
as a fraction of a device-to-device copy of the same number of bytes timed in the same round,
and of a 1 GiB copy. The printed ratio is vLLM's time / ours: 1.0 or more means ours is at least
as fast. ``--sweep`` also times other launch shapes of the recurrent kernel (RecurrentConfig:
rows per program, warps, lanes along K) from B=64 up, fastest first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path
import torch
import triton

from gdn_evidence.harness.agreement import load_providers
from gdn_evidence.harness.layer import QWEN3_NEXT_DIMS
from gdn_evidence.harness.profiling import kernel_time
from gdn_evidence.harness.provenance import provenance
from vllm_gdn_invariant.kernels import conv as conv_kernel
from vllm_gdn_invariant.kernels import recurrent as recurrent_kernel
from vllm_gdn_invariant.kernels.validation import (
    check_conv_args,
    check_recurrent_args,
)

SCHEMA = "vllm-gdn-invariant/bench-decode/1"
BATCH_SIZES = (1, 16, 64, 256, 1024)
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ROUNDS = 7
PEAK_COPY_BYTES = 1 << 30
SWEEP_FROM_BATCH = 64


def bench_us(fn) -> float:
    """Median time of one call in microseconds (triton.testing.do_bench, L2 flushed)."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def copy_fn(num_bytes: int):
    """A device-to-device copy that reads num_bytes / 2 and writes num_bytes / 2."""
    src = torch.empty(max(num_bytes // 2, 1), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def recurrent_case(batch: int, state_dtype: torch.dtype, seed: int) -> dict:
    dims = QWEN3_NEXT_DIMS
    H, HV, K, V = dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim
    g = torch.Generator(device="cuda").manual_seed(seed)
    num_blocks = batch + 1
    return {
        "mixed_qkv": torch.randn(batch, dims.conv_dim, generator=g, device="cuda").bfloat16(),
        "a": torch.randn(batch, HV, generator=g, device="cuda").bfloat16(),
        "b": torch.randn(batch, HV, generator=g, device="cuda").bfloat16(),
        "A_log": torch.log(torch.rand(HV, generator=g, device="cuda") * 15.0 + 1.0),
        "dt_bias": torch.randn(HV, generator=g, device="cuda"),
        "state": (torch.randn(num_blocks, HV, V, K, generator=g, device="cuda") * 0.1).to(
            state_dtype
        ),
        "state_indices": torch.arange(1, batch + 1, dtype=torch.int32, device="cuda"),
        "H": H,
        "scale": K**-0.5,
    }


def recurrent_bytes(x: dict) -> int:
    batch = x["mixed_qkv"].shape[0]
    block = x["state"][0]
    out = batch * block.shape[0] * block.shape[1] * 2  # bf16 out [B, 1, HV, V]
    inputs = sum(x[n].numel() * x[n].element_size() for n in ("mixed_qkv", "a", "b"))
    return 2 * batch * block.numel() * block.element_size() + inputs + out


def conv_case(batch: int, cache_dtype: torch.dtype, seed: int) -> dict:
    dims = QWEN3_NEXT_DIMS
    dim, width = dims.conv_dim, dims.conv_width
    g = torch.Generator(device="cuda").manual_seed(seed)
    return {
        "x": torch.randn(batch, dim, generator=g, device="cuda").bfloat16(),
        "conv_state": torch.randn(batch + 1, dim, width - 1, generator=g, device="cuda").to(
            cache_dtype
        ),
        "weight": (torch.randn(dim, width, generator=g, device="cuda") * 0.5).bfloat16(),
        "state_indices": torch.arange(1, batch + 1, dtype=torch.int32, device="cuda"),
    }


def conv_bytes(x: dict) -> int:
    batch = x["x"].shape[0]
    block = x["conv_state"][0]
    io = 2 * x["x"].numel() * x["x"].element_size()  # x read, out written (bf16)
    weight = x["weight"].numel() * x["weight"].element_size()
    return 2 * batch * block.numel() * block.element_size() + io + weight


def recurrent_arms(providers, x: dict) -> dict:
    """vLLM's packed decode and ours (launch and API), each on its own copy of the state."""
    vllm_state, ours_state, api_state = (x["state"].clone() for _ in range(3))
    batch, HV, V = x["mixed_qkv"].shape[0], x["a"].shape[1], x["state"].shape[2]
    vllm_out = torch.empty(batch, 1, HV, V, dtype=torch.bfloat16, device="cuda")
    gates = (x["mixed_qkv"], x["a"], x["b"], x["A_log"], x["dt_bias"])
    kwargs = {"num_k_heads": x["H"], "scale": x["scale"], "use_qk_l2norm": True}
    dims = check_recurrent_args(*gates, ours_state, x["state_indices"], **kwargs, interpreted=False)
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
        recurrent_kernel.recurrent_step(*gates, api_state, x["state_indices"], **kwargs)

    return {"vllm": vllm, "ours": ours, "ours_api": ours_api, "_dims": dims, "_config": config}


def conv_arms(providers, x: dict) -> dict:
    vllm_state, ours_state, api_state = (x["conv_state"].clone() for _ in range(3))
    vllm_x = x["x"].clone()  # vLLM writes its output over x when x has the cache dtype
    dims = check_conv_args(
        x["x"],
        ours_state,
        x["weight"],
        x["state_indices"],
        bias=None,
        activation="silu",
        dim_first=True,
        interpreted=False,
    )
    config = conv_kernel.conv_config(dims)

    def vllm():
        providers.conv_update(
            vllm_x,
            vllm_state,
            x["weight"],
            bias=None,
            activation="silu",
            conv_state_indices=x["state_indices"],
            validate_data=False,
        )

    def ours():
        conv_kernel.launch_conv(
            x["x"], ours_state, x["weight"], x["state_indices"], None, dims, config
        )

    def ours_api():
        conv_kernel.conv_update(x["x"], api_state, x["weight"], x["state_indices"])

    return {"vllm": vllm, "ours": ours, "ours_api": ours_api}


def time_arms(arms: dict, num_bytes: int, peak_copy) -> dict:
    """ROUNDS alternating rounds of every arm and of a same-size copy; medians and bandwidths."""
    fns = {name: fn for name, fn in arms.items() if not name.startswith("_")}
    fns["copy"] = copy_fn(num_bytes)
    samples = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            samples[name].append(bench_us(fn))
    medians = {name: statistics.median(s) for name, s in samples.items()}
    peak_gbps = PEAK_COPY_BYTES / (bench_us(peak_copy) * 1e3)
    result = {
        "bytes": num_bytes,
        "us": {name: round(t, 2) for name, t in medians.items()},
        "rounds_us": {name: [round(t, 2) for t in s] for name, s in samples.items()},
        "kernel_us": {
            name: round(kernel_time(fns[name]).us, 2) for name in ("vllm", "ours", "ours_api")
        },
        "achieved_GBps": {name: round(num_bytes / (t * 1e3), 1) for name, t in medians.items()},
        "peak_copy_GBps": round(peak_gbps, 1),
    }
    copy = medians["copy"]
    result["fraction_of_copy"] = {
        name: round(copy / medians[name], 3) for name in ("vllm", "ours", "ours_api")
    }
    result["fraction_of_peak_copy"] = {
        name: round(num_bytes / (medians[name] * 1e3) / peak_gbps, 3)
        for name in ("vllm", "ours", "ours_api")
    }
    result["speed_vs_vllm"] = round(medians["vllm"] / medians["ours"], 3)
    result["speed_vs_vllm_api"] = round(medians["vllm"] / medians["ours_api"], 3)
    return result


def sweep_configs(dims, state_dtype: torch.dtype) -> list:
    """Other launch shapes of the recurrent kernel: block rows, warps and lanes along K."""
    default = recurrent_kernel.recurrent_config(dims, state_dtype)
    width = default.log2_j + default.log2_cl + default.log2_vec
    configs = []
    for log2_cl in sorted({default.log2_cl - 1, default.log2_cl, default.log2_cl + 1}):
        log2_j = width - log2_cl - default.log2_vec
        if log2_cl < 0 or log2_j < 0:
            continue
        rows_per_warp = 32 >> log2_cl
        for block_v in (32, 64, 128):
            for num_warps in (2, 4, 8):
                if rows_per_warp * num_warps > block_v or block_v > dims.head_v:
                    continue
                configs.append(
                    recurrent_kernel.RecurrentConfig(
                        block_v, log2_j, log2_cl, default.log2_vec, num_warps
                    )
                )
    return configs


def sweep_recurrent(arms: dict, state_dtype: torch.dtype) -> list[dict]:
    rows = []
    for config in sweep_configs(arms["_dims"], state_dtype):
        us = statistics.median(bench_us(lambda c=config: arms["ours"](c)) for _ in range(3))
        rows.append({"config": config.__dict__, "us": round(us, 2)})
    return sorted(rows, key=lambda r: r["us"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    parser.add_argument("--sweep", action="store_true", help="also time other launch shapes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_decode: CUDA is not available; nothing measured", file=sys.stderr)
        return 2
    try:
        providers = load_providers()
    except (ImportError, AttributeError) as error:
        print(f"bench_decode: vLLM's kernels are not available: {error}", file=sys.stderr)
        return 2
    peak_copy = copy_fn(PEAK_COPY_BYTES)
    cases = []
    print(
        f"{'op':>9} {'state':>8} {'B':>5} {'vLLM us':>9} {'ours us':>9} {'api us':>9} "
        f"{'vLLM/ours':>9} {'vLLM %copy':>10} {'ours %copy':>10}"
    )
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        for dtype_name, state_dtype in STATE_DTYPES.items():
            for op in ("recurrent", "conv"):
                if op == "recurrent":
                    x = recurrent_case(batch, state_dtype, seed=batch)
                    arms, num_bytes = recurrent_arms(providers, x), recurrent_bytes(x)
                else:
                    x = conv_case(batch, state_dtype, seed=batch)
                    arms, num_bytes = conv_arms(providers, x), conv_bytes(x)
                result = time_arms(arms, num_bytes, peak_copy)
                case = {"op": op, "batch": batch, "state_dtype": dtype_name, **result}
                if op == "recurrent":
                    case["config"] = arms["_config"].__dict__
                    if args.sweep and batch >= SWEEP_FROM_BATCH:
                        case["sweep"] = sweep_recurrent(arms, state_dtype)
                cases.append(case)
                us, fraction = result["us"], result["fraction_of_copy"]
                print(
                    f"{op:>9} {dtype_name:>8} {batch:>5} {us['vllm']:>9.1f} {us['ours']:>9.1f} "
                    f"{us['ours_api']:>9.1f} {result['speed_vs_vllm']:>9.3f} "
                    f"{fraction['vllm']:>10.3f} {fraction['ours']:>10.3f}",
                    flush=True,
                )
                del x, arms
                torch.cuda.empty_cache()
    report = {
        "schema": SCHEMA,
        "provenance": provenance(
            recurrent_provider=providers.recurrent_name,
            conv_provider=providers.conv_name,
            rounds=ROUNDS,
        ),
        "settings": {
            "batch_sizes": [int(b) for b in args.batch_sizes.split(",")],
            "dims": QWEN3_NEXT_DIMS.__dict__,
            "inputs": "bf16 randn mixed_qkv/a/b/x/weight; A_log = log(U(1, 16)); "
            "state randn*0.1; conv cache randn; all rows active; QK norm on; SiLU, no bias",
            "speed_vs_vllm": "vLLM median time / ours (launch); >= 1.0: ours at least as fast",
        },
        "cases": cases,
    }
    args.out.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    print(f"bench_decode: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
