"""Time the GDN core of a mixed step, routed vs vLLM's own, in one run (GPU).

Usage: python scripts/bench_mixed_step.py --out FILE.json

For 64 and 256 decode rows beside 2k and 8k prefill tokens (Qwen3-Next dims H=16, HV=32,
K=V=128; fp32 and bf16 state) it times ``_forward_core`` (routed) and
``_forward_core_upstream`` (vLLM's) on the same layer and metadata: ``ROUNDS`` alternating
``triton.testing.do_bench`` medians of each, and the median over rounds; plus the
once-per-step cost of building the split metadata. Wall times on this path are dominated by
host-side launch work and vary between rounds on a shared machine, so it also reports the
device time of the launched kernels (``torch.profiler``), which is what the routing changes.
It prints the ratios routed / upstream; below 1.0 the routed step is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import checkout  # noqa: F401 - this checkout first on sys.path
import torch
import triton

from gdn_evidence.harness.layer import (
    PREFIX,
    QWEN3_NEXT_DIMS,
    build_metadata,
    make_layer,
    make_layer_state,
    make_vllm_config,
    patched_forward_context,
    step_inputs,
    step_requests,
)
from gdn_evidence.harness.profiling import kernel_time
from gdn_evidence.harness.provenance import provenance
from vllm_gdn_invariant.patches import routed_forward_core as routing

GDN_LAYERS_QWEN3_NEXT_80B = 36
ROUNDS = 7
CASES = [(64, 2048), (64, 8192), (256, 2048), (256, 8192)]


def bench_case(vllm_config, state_dtype, decodes, prefill_tokens, device):
    dims = QWEN3_NEXT_DIMS
    g = torch.Generator().manual_seed(decodes + prefill_tokens)
    prefills = [prefill_tokens // 2, prefill_tokens - prefill_tokens // 2]
    requests = step_requests(decodes, prefills, fresh=False)
    num_tokens = decodes + prefill_tokens
    state = make_layer_state(dims, state_dtype, len(requests) + 2, device, g)
    x, b, a = step_inputs(dims, num_tokens, device, g)
    layer = make_layer(vllm_config, dims, state, gqa_interleaved_layout=True)
    meta = build_metadata(vllm_config, requests, device)
    out = torch.empty(
        num_tokens, dims.num_v_heads, dims.head_v_dim, dtype=torch.bfloat16, device=device
    )

    def call(method):
        return lambda: getattr(layer, method)(mixed_qkv=x, b=b, a=a, core_attn_out=out)

    def split_once():
        routing.gdn_invariant_build_split(meta)

    def bench(fn) -> float:
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3

    upstream_fn, routed_fn = call("_forward_core_upstream"), call("_forward_core")
    with patched_forward_context(vllm_config, {PREFIX: meta}):
        samples = {"upstream": [], "routed": []}
        for _ in range(ROUNDS):  # alternate, so drift on a shared GPU hits both sides
            samples["upstream"].append(bench(upstream_fn))
            samples["routed"].append(bench(routed_fn))
        split_us = bench(split_once)
        kernels = {
            k: kernel_time(fn) for k, fn in (("upstream", upstream_fn), ("routed", routed_fn))
        }
    upstream, routed = (statistics.median(samples[k]) for k in ("upstream", "routed"))
    per_step = (GDN_LAYERS_QWEN3_NEXT_80B * routed + split_us) / (
        GDN_LAYERS_QWEN3_NEXT_80B * upstream
    )
    return {
        "decodes": decodes,
        "prefill_tokens": prefill_tokens,
        "state_dtype": str(state_dtype).removeprefix("torch."),
        "upstream_us": round(upstream, 1),
        "routed_us": round(routed, 1),
        "upstream_rounds_us": [round(t, 1) for t in samples["upstream"]],
        "routed_rounds_us": [round(t, 1) for t in samples["routed"]],
        "split_build_us": round(split_us, 1),
        "upstream_gpu_kernel_us": round(kernels["upstream"].us, 1),
        "routed_gpu_kernel_us": round(kernels["routed"].us, 1),
        "upstream_kernels_per_call": round(kernels["upstream"].kernels, 1),
        "routed_kernels_per_call": round(kernels["routed"].kernels, 1),
        "ratio_gpu_kernel_time": round(kernels["routed"].us / kernels["upstream"].us, 3),
        "ratio_routed_over_upstream": round(routed / upstream, 3),
        "ratio_per_step_36_layers": round(per_step, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from vllm_gdn_invariant.plugin import entry

    os.environ["VLLM_GDN_INVARIANT_STRICT"] = "1"
    entry.register()
    device = torch.device("cuda")
    rows = []
    print(
        f"{'dec':>4} {'prefill':>7} {'state':>8} {'upstream us':>11} {'routed us':>9} "
        f"{'split us':>8} {'ratio':>6} {'per step':>8} {'kernel us up/routed':>19} {'ratio':>6}"
    )
    for state_dtype in (torch.float32, torch.bfloat16):
        vllm_config = make_vllm_config(QWEN3_NEXT_DIMS, state_dtype)
        for decodes, prefill_tokens in CASES:
            r = bench_case(vllm_config, state_dtype, decodes, prefill_tokens, device)
            rows.append(r)
            print(
                f"{decodes:>4} {prefill_tokens:>7} {r['state_dtype']:>8} "
                f"{r['upstream_us']:>11} {r['routed_us']:>9} {r['split_build_us']:>8} "
                f"{r['ratio_routed_over_upstream']:>6} {r['ratio_per_step_36_layers']:>8} "
                f"{r['upstream_gpu_kernel_us']:>9}/{r['routed_gpu_kernel_us']:<9} "
                f"{r['ratio_gpu_kernel_time']:>6}",
                flush=True,
            )
        json.dump({"provenance": provenance(), "cases": rows}, open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
