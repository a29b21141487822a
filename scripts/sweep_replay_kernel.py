"""Time launch shapes of the replay kernel on a GPU, as JSON with provenance (a tuning sweep).

    python scripts/sweep_replay_kernel.py --out sweep_replay_kernel.json [--tokens 2048]

For Qwen3-Next's GDN heads (K = V = 128, W = 4, bf16 x, conv state and weights) at TP1 (H=16,
HV=32) and TP4 per rank (H=4, HV=8), 8 and 64 sequences of ``--tokens`` tokens each, and an fp32
and a bf16 state, ``kernels.replay.launch_replay`` is timed with each launch shape of SHAPES
(value rows per program, warps; the K split of the default shape) and with the default shape.
Each time is the median of ``triton.testing.do_bench`` medians over ROUNDS rounds that alternate
the shapes; it is reported per token position (time / tokens), fastest first. For comparison
the same replay is timed as a loop of ``kernels.serving.decode_step`` (the per-token decode step
of mode golden: two launches per token for all sequences), and the bytes the replay must move
(x, outputs, the states read and written once) over its time give its bandwidth.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path
import torch
import triton

from gdn_evidence.harness.provenance import provenance
from vllm_gdn_invariant.kernels.replay import (
    ReplayConfig,
    ReplayTensors,
    launch_replay,
    multiprocessors,
    replay_config,
    replay_dims,
)
from vllm_gdn_invariant.kernels.serving import decode_step

SCHEMA = "vllm-gdn-invariant/sweep-replay-kernel/1"
HEADS = {"tp1": (16, 32), "tp4": (4, 8)}
SEQUENCES = (8, 64)
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SHAPES = ((16, 2), (32, 4), (32, 2), (64, 8), (64, 4), (64, 2), (128, 8), (128, 4))  # (rows, warps)
ROUNDS = 3
K = V = 128
W = 4


def bench_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=50, return_mode="median")


def inputs(heads: str, sequences: int, tokens: int, state_dtype: torch.dtype) -> dict:
    H, HV = HEADS[heads]
    g = torch.Generator(device="cuda").manual_seed(0)
    dim = 2 * H * K + HV * V
    n = sequences * tokens

    def randn(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)

    return {
        "x": randn(n, dim),
        "a": randn(n, HV),
        "b": randn(n, HV),
        "A_log": randn(HV, dtype=torch.float32, scale=0.5),
        "dt_bias": randn(HV, dtype=torch.float32),
        "conv_weight": randn(dim, W, scale=0.5),
        "conv_bias": None,
        "conv_state": randn(sequences + 1, dim, W - 1),
        "conv_indices": torch.arange(1, sequences + 1, device="cuda", dtype=torch.int32),
        "state": randn(sequences + 1, HV, V, K, dtype=state_dtype, scale=0.1),
        "state_indices": torch.arange(1, sequences + 1, device="cuda", dtype=torch.int32),
        "cu_seqlens": torch.arange(0, n + 1, tokens, device="cuda", dtype=torch.int32),
    }


def replay_bytes(t: dict) -> int:
    """x and a, b read, out written, the states read and written once."""
    n, HV = t["a"].shape
    active = t["state"][1:]
    return (
        t["x"].numel() * 2
        + 2 * t["a"].numel() * 2
        + n * HV * V * 2
        + 2 * active.numel() * active.element_size()
        + 2 * t["conv_state"][1:].numel() * 2
    )


def run_case(heads: str, sequences: int, tokens: int, state: str) -> dict:
    t = inputs(heads, sequences, tokens, STATE_DTYPES[state])
    H, _ = HEADS[heads]
    tensors = ReplayTensors(**t)
    dims = replay_dims(tensors, num_k_heads=H, scale=K**-0.5)
    default = replay_config(dims, t["state"].dtype, multiprocessors(t["x"].device))
    configs = {"default": default}
    for rows, warps in SHAPES:
        configs[f"BV{rows}-w{warps}"] = ReplayConfig(
            rows, default.log2_j, default.log2_cl, default.log2_vec, warps
        )
    out = torch.empty(
        (t["x"].shape[0], *t["state"].shape[1:3]), dtype=torch.bfloat16, device="cuda"
    )

    def replay(config: ReplayConfig):
        return lambda: launch_replay(tensors, out, dims, config)

    x = t["x"].view(sequences, tokens, -1)
    a = t["a"].view(sequences, tokens, -1)
    b = t["b"].view(sequences, tokens, -1)

    def per_token():
        for i in range(tokens):
            decode_step(
                x[:, i], a[:, i], b[:, i], t["A_log"], t["dt_bias"], t["conv_state"],
                t["conv_weight"], None, t["state"], t["state_indices"], num_k_heads=H,
                scale=K**-0.5,
            )  # fmt: skip

    arms = {name: replay(config) for name, config in configs.items()}
    arms["per_token_decode_step"] = per_token
    times = {name: [] for name in arms}
    for _ in range(ROUNDS):
        for name, fn in arms.items():
            times[name].append(bench_ms(fn))
    medians = {name: statistics.median(values) for name, values in times.items()}
    nbytes = replay_bytes(t)
    shapes = sorted(
        (
            {
                "shape": name,
                "config": vars(configs[name]) if name in configs else None,
                "ms": round(ms, 4),
                "us_per_token": round(ms * 1e3 / tokens, 4),
                "bandwidth_GBps": round(nbytes / (ms * 1e-3) / 1e9, 1),
                "rounds_ms": [round(v, 4) for v in times[name]],
            }
            for name, ms in medians.items()
        ),
        key=lambda row: row["ms"],
    )
    return {
        "heads": heads,
        "H": H,
        "HV": HEADS[heads][1],
        "sequences": sequences,
        "tokens": tokens,
        "state_dtype": state,
        "pairs": sequences * HEADS[heads][1],
        "default": vars(default),
        "default_over_best": round(medians["default"] / shapes[0]["ms"], 3),
        "per_token_over_default": round(medians["per_token_decode_step"] / medians["default"], 1),
        "shapes": shapes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args()
    cases = []
    for heads in HEADS:
        for sequences in SEQUENCES:
            for state in STATE_DTYPES:
                case = run_case(heads, sequences, args.tokens, state)
                best = case["shapes"][0]
                print(
                    f"{heads} S={sequences} {state}: default {case['default']} "
                    f"{case['default_over_best']}x the best ({best['shape']}, "
                    f"{best['us_per_token']} us/token); per-token decode steps "
                    f"{case['per_token_over_default']}x the default",
                    flush=True,
                )
                cases.append(case)
    record = {"schema": SCHEMA, "provenance": provenance(tokens=args.tokens), "cases": cases}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
