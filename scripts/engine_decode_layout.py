"""The recurrent step on the engine's own tensors: a decode launch kept from vLLM's real engine,
its layouts, and vLLM's packed decode and ours timed on them (GPU).

    python scripts/engine_decode_layout.py --out engine_decode_layout.json [--batch 128]
        [--mode golden|route]

The engine (the bench model of ``scripts/bench_engine.py``, dummy weights, eager, its core in
this script's child process, the plugin in ``--mode``) serves the decode workload's prompts
(DECODE_PROMPTS of 64 words, a few new tokens each). In mode golden the decode step's recurrent
launch (``kernels.serving.launch_into``) is wrapped: the first one with ``--batch`` rows keeps
the layer's state pool (vLLM's ``ssm_state``, a view of the engine's KV cache) and copies of its
other inputs. In mode route vLLM's own ``fused_recurrent_gated_delta_rule_packed_decode`` call is
wrapped instead and its tensors are kept as the views vLLM passed (ours' launch shape is the one
mode golden would pick for them). After the generation the child times, by device time
(profiler, the mean of ``kernel_time``'s calls, rounds alternating), vLLM's packed decode and
ours (``kernels.recurrent.launch_into`` at that launch shape) on:

* ``engine``: the state pool and indices as the engine had them;
* ``engine_sorted``: the pool, the indices in increasing order;
* ``compact``: the rows' states copied to a pool of B + 1 blocks, indices 1..B (the layout
  ``bench_decode.py`` times).

Both kernels of an arm take the same inputs, each on its own state (the arm's pool for vLLM's,
a copy for ours where the pool is compact; in the engine's pool each writes the blocks in
place, which only their values, not their speed, depend on). The JSON holds the layouts (shape,
strides, alignment, whether a request into L2 ahead could be issued for it: ``l2_ahead``), the
indices' spread and each arm's times and ratio vLLM/ours.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import checkout  # noqa: F401 - this checkout first on sys.path

from gdn_evidence.e2e.bench import DECODE_PROMPTS, bench_model
from gdn_evidence.e2e.engine_options import ATTENTION_BACKEND, PREFILL_BACKEND, engine_options
from gdn_evidence.e2e.engine_process import in_process_engine_env
from gdn_evidence.e2e.plugin_site import plugin_site
from gdn_evidence.harness.loads_ahead_kernel import device_capability, l2_ahead
from gdn_evidence.harness.provenance import provenance
from gdn_evidence.harness.scratch import scratch_folder
from vllm_gdn_invariant.models.tiny import words, write_tiny_model

SCHEMA = "vllm-gdn-invariant/engine-decode-layout/1"
ARMS = ("engine", "engine_sorted", "compact")


def layout(tensor: Any) -> dict[str, Any]:
    """Shape, strides, dtype and the base address' alignment of a tensor."""
    return {
        "shape": list(tensor.shape),
        "stride": list(tensor.stride()),
        "dtype": str(tensor.dtype),
        "contiguous": tensor.is_contiguous(),
        "base_mod_128": tensor.data_ptr() % 128,
    }


def index_spread(indices: list[int]) -> dict[str, Any]:
    """How the state indices lie in the pool: range, order and gaps between neighbours."""
    gaps = [b - a for a, b in zip(indices, indices[1:], strict=False)]
    return {
        "count": len(indices),
        "min": min(indices),
        "max": max(indices),
        "increasing": all(g > 0 for g in gaps),
        "unit_gaps": sum(g == 1 for g in gaps),
        "first": indices[:16],
    }


def ratio_summary(times: dict[str, list[float]]) -> dict[str, Any]:
    """Median device time per kernel and vLLM/ours of the medians and per round."""
    rounds = [v / o for v, o in zip(times["vllm"], times["ours"], strict=True)]
    return {
        "vllm_us": statistics.median(times["vllm"]),
        "ours_us": statistics.median(times["ours"]),
        "vllm_over_ours": statistics.median(times["vllm"]) / statistics.median(times["ours"]),
        "round_ratios": rounds,
    }


def run_engine(spec: dict[str, Any]) -> dict[str, Any]:
    """In the engine's process: generate, keep the decode launch, time the kernels."""
    import torch
    from vllm import LLM, SamplingParams
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen

    from gdn_evidence.harness.agreement import load_providers
    from gdn_evidence.harness.profiling import kernel_time
    from vllm_gdn_invariant.kernels import recurrent as recurrent_kernel
    from vllm_gdn_invariant.kernels import serving
    from vllm_gdn_invariant.kernels.validation import check_recurrent_args

    kept: dict[str, Any] = {}
    launch_into = serving.launch_into
    packed_decode = qwen.fused_recurrent_gated_delta_rule_packed_decode

    def keep(mixed_qkv, a, b, A_log, dt_bias, state, state_indices, dims, config):
        kept.update(
            mixed_qkv_layout=layout(mixed_qkv),
            a_layout=layout(a),
            tensors=(mixed_qkv, a, b, A_log, dt_bias),
            state=state,
            state_indices=state_indices.clone(),
            dims=dims,
            config=config,
        )

    def keeping(out, mixed_qkv, a, b, A_log, dt_bias, state, state_indices, dims, config):
        if dims.batch == spec["batch"] and not kept:  # mode golden's decode step
            keep(mixed_qkv.clone(), a.clone(), b.clone(), A_log, dt_bias, state, state_indices,
                 dims, config)  # fmt: skip
        return launch_into(out, mixed_qkv, a, b, A_log, dt_bias, state, state_indices, dims, config)

    def keeping_vllm(**kwargs):
        mixed_qkv, indices = kwargs["mixed_qkv"], kwargs["ssm_state_indices"]
        if mixed_qkv.shape[0] == spec["batch"] and not kept:  # mode route: vLLM's views as-is
            state, a, b = kwargs["initial_state"], kwargs["a"], kwargs["b"]
            HV, V, K = state.shape[1:]
            dims = check_recurrent_args(
                mixed_qkv, a, b, kwargs["A_log"], kwargs["dt_bias"], state, indices,
                num_k_heads=(mixed_qkv.shape[1] - HV * V) // (2 * K), scale=kwargs["scale"],
                use_qk_l2norm=True, interpreted=False,
            )  # fmt: skip
            config = recurrent_kernel.recurrent_config(dims, state.dtype)
            keep(mixed_qkv, a, b, kwargs["A_log"], kwargs["dt_bias"], state, indices, dims, config)
        return packed_decode(**kwargs)

    serving.launch_into = keeping
    qwen.fused_recurrent_gated_delta_rule_packed_decode = keeping_vllm
    try:
        llm = LLM(
            model=spec["model_dir"],
            load_format="dummy",
            max_model_len=2048,
            enforce_eager=True,
            enable_prefix_caching=False,
            seed=0,
            max_num_seqs=spec["max_num_seqs"],
            **engine_options(ATTENTION_BACKEND, PREFILL_BACKEND, spec["gpu_memory_utilization"]),
        )
        prompts = [words(64, start=11 * i) for i in range(DECODE_PROMPTS)]
        params = SamplingParams(temperature=0.0, max_tokens=spec["new_tokens"], ignore_eos=True)
        llm.generate(prompts, params, use_tqdm=False)
    finally:
        serving.launch_into = launch_into
        qwen.fused_recurrent_gated_delta_rule_packed_decode = packed_decode
    if not kept:
        raise RuntimeError(f"no decode launch of {spec['batch']} rows in the engine")

    pool, indices, dims, config = kept["state"], kept["state_indices"], kept["dims"], kept["config"]
    gates = kept["tensors"]
    batch = dims.batch
    capability = device_capability(pool.device)
    compact = torch.zeros((batch + 1, *pool.shape[1:]), dtype=pool.dtype, device=pool.device)
    compact[1:] = pool[indices.long()]
    inputs = {
        "engine": (pool, indices),
        "engine_sorted": (pool, indices.sort().values),
        "compact": (compact, torch.arange(1, batch + 1, dtype=indices.dtype, device=pool.device)),
    }
    providers = load_providers()
    scale = dims.scale
    functions = {}
    for arm, (state, arm_indices) in inputs.items():
        ours_state = state if arm != "compact" else state.clone()
        vllm_out = torch.empty(batch, 1, dims.num_v_heads, dims.head_v, dtype=gates[0].dtype,
                               device=pool.device)  # fmt: skip
        ours_out = recurrent_kernel.new_output(gates[0], dims)

        def vllm(state=state, arm_indices=arm_indices, vllm_out=vllm_out):
            providers.packed_decode(
                mixed_qkv=gates[0], a=gates[1], b=gates[2], A_log=gates[3], dt_bias=gates[4],
                scale=scale, initial_state=state, out=vllm_out, ssm_state_indices=arm_indices,
                use_qk_l2norm_in_kernel=True,
            )  # fmt: skip

        def ours(state=ours_state, arm_indices=arm_indices, ours_out=ours_out):
            recurrent_kernel.launch_into(ours_out, *gates, state, arm_indices, dims, config)

        functions[arm] = {"vllm": vllm, "ours": ours}
    times: dict[str, dict[str, list[float]]] = {a: {"vllm": [], "ours": []} for a in ARMS}
    for r in range(spec["rounds"]):
        for arm in ARMS:
            order = ("vllm", "ours") if r % 2 == 0 else ("ours", "vllm")
            for name in order:
                times[arm][name].append(kernel_time(functions[arm][name]).us)
    return {
        "mode": spec["mode"],
        "batch": batch,
        "capability": capability,
        "config": {k: getattr(config, k) for k in config.__dataclass_fields__},
        "mixed_qkv": kept["mixed_qkv_layout"],
        "a": kept["a_layout"],
        "indices": index_spread(indices.tolist()),
        "layouts": {
            arm: {
                **layout(state),
                "l2_ahead": l2_ahead(state, config, capability),
            }
            for arm, (state, _) in inputs.items()
            if arm != "engine_sorted"
        },
        "arms": {arm: ratio_summary(times[arm]) for arm in ARMS},
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--batch", type=int, default=DECODE_PROMPTS, help="rows of the launch")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--mode",
        choices=("golden", "route"),
        default="golden",
        help="the plugin's mode: golden keeps its decode step's launch, route vLLM's call",
    )
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--num-layers", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    parser.add_argument("--run-engine", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.run_engine:
        spec = json.loads(args.run_engine)
        Path(spec["result"]).write_text(json.dumps(run_engine(spec)))
        return 0
    if args.out is None:
        build_parser().error("--out is required")
    if not 1 <= args.batch <= DECODE_PROMPTS:
        build_parser().error(f"--batch must be 1 to {DECODE_PROMPTS}")
    work = scratch_folder("gdn_layout_")
    site = plugin_site(work / "plugin-site")
    model = bench_model(False, args.num_layers)
    spec = {
        "model_dir": str(write_tiny_model(work / "model", **model)),
        "batch": args.batch,
        "rounds": args.rounds,
        "mode": args.mode,
        "new_tokens": args.new_tokens,
        "max_num_seqs": max(256, DECODE_PROMPTS),
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "result": str(work / "result.json"),
    }
    env = in_process_engine_env(site, mode=args.mode, batch_invariant=False)
    command = [sys.executable, __file__, "--run-engine", json.dumps(spec)]
    done = subprocess.run(command, env=env, check=False)
    record = {"schema": SCHEMA, "provenance": provenance(model=model), "spec": spec}
    if done.returncode != 0:
        record["error"] = f"engine process exited {done.returncode}"
    else:
        record["result"] = json.loads(Path(spec["result"]).read_text())
    args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps(record.get("result", record), indent=1)[:4000])
    return 0 if "result" in record else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
