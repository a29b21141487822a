"""What the history replay costs, at the layer level on the GPU (vLLM's real builder,
``_forward_core`` and kernels; Qwen3-Next's GDN dims, float32 state).

* Steps of requests that were never preempted (64 decode rows alone, and beside two
  512-token prefills): vLLM's metadata builder (one instance for the run, as in the engine)
  plus ``_forward_core`` with the routing alone and with the routing and the history replay
  installed, alternating arms; host wall time per step and device kernel time per step
  (``torch.profiler``) for each.
* Recomputed history (R rows of L generated tokens each): the replay (one decode step of
  vLLM's decode kernels per token position) against the same rows on the chunk kernels, wall
  time per step with the device synchronized; per replayed token. In mode golden, the replay
  one golden decode step per token position against all history tokens in one call of the
  replay kernels (``kernels/replay.py``).

Usage (GPU machine, vLLM's Python code on PYTHONPATH, e.g. the engine bundle):
    python scripts/bench_history_replay.py --out $OUT/bench_history_replay.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path
import torch

from gdn_evidence.harness.layer import (
    PREFIX,
    QWEN3_NEXT_DIMS,
    Request,
    common_metadata,
    make_layer,
    make_layer_state,
    make_vllm_config,
    mamba_spec,
    run_core,
    step_inputs,
)
from gdn_evidence.harness.provenance import provenance
from vllm_gdn_invariant.patches import applied, routing_patch
from vllm_gdn_invariant.patches.golden_decode import golden_decode_patches
from vllm_gdn_invariant.patches.history_replay import builder_patch

CUDA = torch.device("cuda")
DIMS = QWEN3_NEXT_DIMS
DECODE = Request(1, 300, False)
STEPS = {
    "decode-only 64": [DECODE] * 64,
    "64 decodes + 2 prefills of 512": [DECODE] * 64 + [Request(512, 0, True)] * 2,
}
HISTORY = {"1 x 64": (1, 64), "8 x 64": (8, 64), "1 x 512": (1, 512), "8 x 512": (8, 512)}


def arms():
    return {
        "routing": [routing_patch()],
        "routing+replay": [routing_patch(history_replay=True), builder_patch()],
    }


def metadata_builder(vllm_config):
    """vLLM's GDN metadata builder, made once as the engine makes it (and reused per step)."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    with set_current_vllm_config(vllm_config):
        return GDNAttentionMetadataBuilder(
            kv_cache_spec=mamba_spec(vllm_config),
            layer_names=[PREFIX],
            vllm_config=vllm_config,
            device=CUDA,
        )


BUILDER = {}


def one_step(vllm_config, state, requests, inputs) -> float:
    """Build the step's metadata (one builder for the run, as in the engine) and run the
    layer once; host wall seconds (device synchronized)."""
    builder = BUILDER.setdefault(id(vllm_config), metadata_builder(vllm_config))
    layer = make_layer(vllm_config, DIMS, state, gqa_interleaved_layout=True)
    common = common_metadata(requests, CUDA)
    torch.cuda.synchronize()
    start = time.perf_counter()
    metadata = builder.build(common_prefix_len=0, common_attn_metadata=common)
    run_core(layer, vllm_config, metadata, *inputs)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def kernel_us(vllm_config, state, requests, inputs, steps: int = 10) -> float:
    """Device kernel time per step (sum of CUDA kernel durations), microseconds."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            one_step(vllm_config, state, requests, inputs)
    total = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total > 0)
    return total / steps


def never_preempted(vllm_config, rounds: int) -> dict:
    results = {}
    for name, requests in STEPS.items():
        g = torch.Generator().manual_seed(1)
        state = make_layer_state(DIMS, torch.float32, len(requests) + 2, CUDA, g)
        inputs = step_inputs(DIMS, sum(r.query_len for r in requests), CUDA, g)
        wall = {arm: [] for arm in arms()}
        kernel = {}
        for patches in arms().values():  # warm up (compiles)
            with applied(patches):
                for _ in range(3):
                    one_step(vllm_config, state, requests, inputs)
        for r in range(rounds):
            order = list(arms().items())
            if r % 2:
                order.reverse()
            for arm, patches in order:
                with applied(patches):
                    wall[arm] += [one_step(vllm_config, state, requests, inputs) for _ in range(5)]
        for arm, patches in arms().items():
            with applied(patches):
                kernel[arm] = kernel_us(vllm_config, state, requests, inputs)
        medians = {arm: statistics.median(v) * 1e6 for arm, v in wall.items()}
        results[name] = {
            "host_wall_us_median": medians,
            "host_wall_ratio": medians["routing+replay"] / medians["routing"],
            "kernel_us_per_step": kernel,
            "kernel_ratio": kernel["routing+replay"] / kernel["routing"],
        }
    return results


def history_arms():
    """The history cost's arms: mode route's replay, the chunk kernels, and mode golden's
    replay per token position and in one call."""
    golden_decode = golden_decode_patches()[:1]  # the CUDA decode path
    return {
        "replay": arms()["routing+replay"],
        "chunk kernels": arms()["routing"],
        "golden per position": [
            routing_patch(history_replay=True),
            builder_patch(),
            *golden_decode,
        ],
        "golden in one call": [
            routing_patch(history_replay=True, golden=True),
            builder_patch(),
            *golden_decode_patches()[:1],
        ],
    }


def history_cost(vllm_config, rounds: int) -> dict:
    results = {}
    for name, (rows, length) in HISTORY.items():
        requests = [Request(length, 300 + 17 * i, False) for i in range(rows)]
        g = torch.Generator().manual_seed(2)
        state = make_layer_state(DIMS, torch.float32, rows + 2, CUDA, g)
        inputs = step_inputs(DIMS, rows * length, CUDA, g)
        timings = {arm: [] for arm in history_arms()}
        for patches in history_arms().values():  # warm up
            with applied(patches):
                one_step(vllm_config, state, requests, inputs)
        for r in range(rounds):
            order = list(history_arms().items())
            if r % 2:
                order.reverse()
            for arm, patches in order:
                with applied(patches):
                    timings[arm].append(one_step(vllm_config, state, requests, inputs))
        medians = {arm: statistics.median(v) * 1e3 for arm, v in timings.items()}
        extra = {arm: medians[arm] - medians["chunk kernels"] for arm in medians}
        per_token = {arm: ms * 1e3 / (rows * length) for arm, ms in extra.items()}
        results[name] = {
            "wall_ms_median": medians,
            "replay_us_per_token": per_token["replay"],
            "replay_us_per_position": medians["replay"] * 1e3 / length,
            "golden_per_position_us_per_token": per_token["golden per position"],
            "golden_in_one_call_us_per_token": per_token["golden in one call"],
            "golden_one_call_speedup": extra["golden per position"] / extra["golden in one call"],
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    vllm_config = make_vllm_config(DIMS, torch.float32)
    result = {
        "provenance": provenance(script="scripts/bench_history_replay.py", dims=str(DIMS)),
        "never_preempted": never_preempted(vllm_config, args.rounds),
        "history": history_cost(vllm_config, args.rounds),
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "provenance"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
