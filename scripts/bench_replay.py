"""Time replay_response against the chunk kernels and the per-token public API (CUDA), as JSON.

    python scripts/bench_replay.py --out bench_replay.json [--lengths 256 2048 8192]
        [--sequences 8 64] [--layout tp1|tp4] [--rounds 3] [--backward-max-tokens N]
    python scripts/bench_replay.py --smoke --out smoke.json     # CPU, toy sizes (CI)
    python scripts/bench_replay.py --table bench_replay.json     # its Markdown table

For each response length T and number of sequences S (every sequence T tokens, Qwen3-Next's
GDN dims of the layout, bf16 x, a, b, weights and conv state, a float32 state), these arms run
on the same inputs, in a rotating order within each round, each timed as one call between two
device synchronizations:

* ``replay``: ``replay_response``'s forward (one launch of the replay kernel), no grad;
* ``chunk``: vLLM's chunk prefill of the same tokens (``causal_conv1d_fn``,
  ``fused_post_conv_prep``, FLA's ``chunk_gated_delta_rule``, called as ``prompt_state`` calls
  them), the forward a trainer would otherwise run;
* ``per_token``: the public decode kernels, ``kernels.conv_update`` then
  ``kernels.recurrent_step`` on the S sequences' token t, for t = 0 .. T-1 (argument checks
  included, as a caller gets them);
* ``replay_backward``: ``replay_response``'s backward (recomputation and backpropagation) of
  ``sum(out * w) + sum(state * u)``, timed alone after an untimed forward;
* ``chunk_backward``: the backward of FLA's own ``chunk_gated_delta_rule`` (the ``fla``
  package, flash-linear-attention, which has one; vLLM's copy is forward only) on the conv
  outputs, when ``fla`` imports; else recorded as missing.

Each arm's time is the median over the rounds; the printed ratios are arm / replay (forward)
and chunk_backward / replay_backward: above 1 means the replay is faster. A size whose token
count exceeds ``--backward-max-tokens`` skips the backward arms (recorded as skipped). The JSON
(``--out``, rewritten after each size) holds the provenance, the arguments and one row per size.
``--smoke`` runs on the CPU at toy dims: the replay and the per-token arm through the goldens
(the public kernels need CUDA there), the replay's backward, the chunk arms skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path
import torch

from gdn_evidence.harness.layer import LAYOUTS, LayerDims
from gdn_evidence.harness.provenance import provenance
from vllm_gdn_invariant import golden, kernels
from vllm_gdn_invariant.replay import replay_response
from vllm_gdn_invariant.replay.checks import ReplayInputs, check_replay_args
from vllm_gdn_invariant.replay.prompt import prefill_with_vllm

SCHEMA = "vllm-gdn-invariant/bench-replay/1"
SMOKE_DIMS = LayerDims(num_k_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=3, conv_width=4)
FORWARD_ARMS = ("replay", "chunk", "per_token")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds(fn: Callable[[], object], device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def make_inputs(dims: LayerDims, sequences: int, length: int, device: torch.device) -> dict:
    g = torch.Generator().manual_seed(sequences * 100003 + length)
    n, HV = sequences * length, dims.num_v_heads

    def randn(*shape, scale=1.0, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=g) * scale).to(dtype=dtype, device=device)

    return {
        "x": randn(n, dims.conv_dim),
        "a": randn(n, HV),
        "b": randn(n, HV),
        "A_log": randn(HV, scale=0.5, dtype=torch.float32),
        "dt_bias": randn(HV, scale=0.5),
        "conv_weight": randn(dims.conv_dim, dims.conv_width, scale=0.3),
        "conv_state": randn(sequences, dims.conv_dim, dims.conv_width - 1, scale=0.3),
        "state": randn(
            sequences, HV, dims.head_v_dim, dims.head_k_dim, scale=0.05, dtype=torch.float32
        ),  # fmt: skip
        "cu_seqlens": torch.arange(sequences + 1, dtype=torch.int32) * length,
    }


def replay_args(inputs: dict) -> tuple:
    names = ("x", "a", "b", "A_log", "dt_bias", "conv_weight", "conv_state", "state", "cu_seqlens")
    return tuple(inputs[n] for n in names)


def replay_arm(inputs: dict, kwargs: dict) -> Callable[[], object]:
    def run():
        with torch.no_grad():
            return replay_response(*replay_args(inputs), **kwargs)

    return run


def chunk_arm(inputs: dict, dims: LayerDims) -> Callable[[], object]:
    """vLLM's prefill of the tokens from zero states, as prompt_state runs it."""
    checked = check_replay_args(
        *replay_args(inputs), num_k_heads=dims.num_k_heads, scale=dims.head_k_dim**-0.5,
        conv_bias=None, activation="silu", use_qk_l2norm=True,
    )  # fmt: skip

    tensors = ReplayInputs(**{n: inputs.get(n) for n in ReplayInputs._fields})  # no conv_bias

    def run():
        with torch.no_grad():
            return prefill_with_vllm(tensors, checked=checked, fresh=True)

    return run


def per_token_arm(inputs: dict, dims: LayerDims, length: int) -> Callable[[], object]:
    """The public decode step per token position: the kernels on CUDA, the goldens elsewhere."""
    device = inputs["x"].device
    sequences = inputs["state"].shape[0]
    blocks = torch.arange(1, sequences + 1, dtype=torch.int32, device=device)
    starts = torch.arange(sequences, device=device) * length
    kw = {"num_k_heads": dims.num_k_heads, "scale": dims.head_k_dim**-0.5}

    def pools():
        conv = torch.cat([torch.zeros_like(inputs["conv_state"][:1]), inputs["conv_state"]])
        return conv, torch.cat([torch.zeros_like(inputs["state"][:1]), inputs["state"]])

    def run_kernels():
        conv_pool, state_pool = pools()
        for t in range(length):
            rows = starts + t
            y = kernels.conv_update(
                inputs["x"][rows], conv_pool, inputs["conv_weight"], blocks, activation="silu"
            )
            kernels.recurrent_step(
                y, inputs["a"][rows], inputs["b"][rows], inputs["A_log"], inputs["dt_bias"],
                state_pool, blocks, **kw,
            )  # fmt: skip

    def run_goldens():
        conv_pool, state_pool = pools()
        for t in range(length):
            rows = starts + t
            y, conv_pool = golden.conv_update(
                inputs["x"][rows], conv_pool, inputs["conv_weight"], blocks, activation="silu"
            )
            _, state_pool = golden.recurrent_step(
                y, inputs["a"][rows], inputs["b"][rows], inputs["A_log"], inputs["dt_bias"],
                state_pool, blocks, **kw,
            )  # fmt: skip

    return run_kernels if device.type == "cuda" else run_goldens


def replay_backward_arm(inputs: dict, kwargs: dict) -> Callable[[], Callable[[], object]]:
    """Returns a setup that runs the forward (untimed) and gives the backward to time."""
    g = torch.Generator().manual_seed(7)
    device = inputs["x"].device

    def setup():
        leaves = {n: t.detach().requires_grad_(t.is_floating_point()) for n, t in inputs.items()}
        out, _, state = replay_response(*replay_args(leaves), **kwargs)
        w = torch.randn(out.shape, generator=g).to(device=device, dtype=out.dtype)
        loss = (out * w).float().sum() + state.sum()
        return loss.backward

    return setup


def fla_chunk_backward_arm(inputs: dict, dims: LayerDims) -> Callable[[], object] | None:
    """FLA's chunk forward+backward on the conv outputs (setup untimed), or None without fla."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    H, HV, K = dims.num_k_heads, dims.num_v_heads, dims.head_k_dim
    n = inputs["x"].shape[0]

    def setup():
        with torch.no_grad():
            from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen

            conv_out = qwen.causal_conv1d_fn(
                inputs["x"].transpose(0, 1), inputs["conv_weight"], None, activation="silu",
                conv_states=torch.cat([inputs["conv_state"][:1], inputs["conv_state"]]),
                has_initial_state=torch.zeros(inputs["state"].shape[0], dtype=torch.bool,
                                              device=inputs["x"].device),
                cache_indices=torch.arange(1, inputs["state"].shape[0] + 1, dtype=torch.int32,
                                           device=inputs["x"].device),
                query_start_loc=inputs["cu_seqlens"].to(inputs["x"].device),
            ).transpose(0, 1)  # fmt: skip
        y = conv_out.detach().requires_grad_(True)
        q = y[:, : H * K].reshape(1, n, H, K).repeat_interleave(HV // H, dim=2)
        k = y[:, H * K : 2 * H * K].reshape(1, n, H, K).repeat_interleave(HV // H, dim=2)
        v = y[:, 2 * H * K :].reshape(1, n, HV, dims.head_v_dim)
        a = inputs["a"].float().requires_grad_(True)
        g = -inputs["A_log"].exp() * torch.nn.functional.softplus(a + inputs["dt_bias"].float())
        beta = inputs["b"].float().sigmoid()
        o, final = chunk_gated_delta_rule(
            q, k, v, g[None], beta[None].to(q.dtype),
            initial_state=inputs["state"].transpose(-1, -2).contiguous().requires_grad_(True),
            output_final_state=True, cu_seqlens=inputs["cu_seqlens"].to(y.device).long(),
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        loss = o.float().sum() + final.sum()
        return loss.backward

    return setup


def bench_size(dims: LayerDims, sequences: int, length: int, args, device) -> dict:
    inputs = make_inputs(dims, sequences, length, device)
    kwargs = {"num_k_heads": dims.num_k_heads, "scale": dims.head_k_dim**-0.5}
    arms: dict[str, Callable[[], object]] = {
        "replay": replay_arm(inputs, kwargs),
        "per_token": per_token_arm(inputs, dims, length),
    }
    skipped: dict[str, str] = {}
    if device.type == "cuda":
        arms["chunk"] = chunk_arm(inputs, dims)
    else:
        skipped["chunk"] = "vLLM's chunk kernels need CUDA"
    backward: dict[str, Callable[[], Callable[[], object]]] = {}
    if sequences * length <= args.backward_max_tokens:
        backward["replay_backward"] = replay_backward_arm(inputs, kwargs)
        fla_setup = fla_chunk_backward_arm(inputs, dims) if device.type == "cuda" else None
        if fla_setup is None:
            skipped["chunk_backward"] = "needs CUDA and the fla package (flash-linear-attention)"
        else:
            backward["chunk_backward"] = fla_setup
    else:
        reason = f"{sequences * length} tokens > --backward-max-tokens"
        skipped.update(replay_backward=reason, chunk_backward=reason)

    for fn in arms.values():  # compile and warm up, untimed
        fn()
    times: dict[str, list[float]] = {name: [] for name in [*arms, *backward]}
    for r in range(args.rounds):
        names = list(arms) + list(backward)
        names = names[r % len(names) :] + names[: r % len(names)]  # rotate the order
        for name in names:
            if name in arms:
                times[name].append(seconds(arms[name], device))
            else:
                step = backward[name]()
                times[name].append(seconds(step, device))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    ratios = {
        f"{name}/replay": medians[name] / medians["replay"]
        for name in ("chunk", "per_token")
        if name in medians
    }
    if "chunk_backward" in medians and "replay_backward" in medians:
        ratios["chunk_backward/replay_backward"] = (
            medians["chunk_backward"] / medians["replay_backward"]
        )
    return {
        "sequences": sequences,
        "tokens_per_sequence": length,
        "tokens": sequences * length,
        "seconds": times,
        "median_s": medians,
        "ratios": ratios,
        "skipped": skipped,
    }


def results_table(record: dict) -> str:
    """The Markdown table of a file's rows: medians in ms and the ratios to the replay."""
    lines = [
        "| sequences x tokens | replay (ms) | chunk (ms) | per-token (ms) | chunk / replay "
        "| per-token / replay | replay backward (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in record["rows"]:
        ms = {name: f"{1e3 * t:.2f}" for name, t in row["median_s"].items()}
        ratio = {name: f"{r:.2f}" for name, r in row["ratios"].items()}
        cells = [
            f"{row['sequences']} x {row['tokens_per_sequence']}",
            ms["replay"],
            ms.get("chunk", "-"),
            ms["per_token"],
            ratio.get("chunk/replay", "-"),
            ratio["per_token/replay"],
            ms.get("replay_backward", "-"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out")
    parser.add_argument("--table", type=Path, help="print the results table of this JSON file")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 2048, 8192])
    parser.add_argument("--sequences", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="tp1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backward-max-tokens", type=int, default=1 << 62)
    parser.add_argument("--smoke", action="store_true", help="CPU, toy dims (CI)")
    args = parser.parse_args()
    if args.table is not None:
        print(results_table(json.loads(args.table.read_text())))
        return 0
    if args.out is None:
        parser.error("--out is required (or --table)")
    if args.smoke:
        device, dims = torch.device("cpu"), SMOKE_DIMS
        args.lengths, args.sequences, args.rounds = [3], [2], 2
    else:
        if not torch.cuda.is_available():
            parser.error("needs CUDA (or --smoke)")
        device, dims = torch.device("cuda"), LAYOUTS[args.layout]
    record = {
        "schema": SCHEMA,
        "provenance": provenance(),
        "arguments": {k: v for k, v in vars(args).items() if k != "out"},
        "dims": dims.__dict__,
        "rows": [],
    }
    for length in args.lengths:
        for sequences in args.sequences:
            row = bench_size(dims, sequences, length, args, device)
            record["rows"].append(row)
            Path(args.out).write_text(json.dumps(record, indent=1))
            shown = "  ".join(f"{k} {v:.3g}" for k, v in row["median_s"].items())
            ratios = "  ".join(f"{k} x{v:.2f}" for k, v in row["ratios"].items())
            print(f"S={sequences} T={length}: {shown} s | {ratios}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
