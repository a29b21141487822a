"""The engine evidence of the response replay: served GDN layers replayed bit for bit.

One engine per model, each in its own process: vLLM's real engine with the plugin in mode
golden and ``VLLM_BATCH_INVARIANT=1``, its engine core in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that the capture reaches vLLM's model runner,
``enforce_eager=True`` (no CUDA graphs: every step's GDN layers run through Python, where the
capture sees them), prefix caching off (one state block per request), asynchronous scheduling
off, a seeded tiny model (``vllm_gdn_invariant.models.weighted``). In that engine:

1. ``PROMPTS`` (lengths not multiples of 64 among them), each generating ``NEW_TOKENS`` greedy
   tokens, are submitted together under a step budget of ``MAX_NUM_BATCHED_TOKENS``: the
   prompts are prefilled in chunks on the 64-token grid, and steps mix one request's decode rows
   with another's prompt chunk;
2. ``gdn_capture.EngineCapture`` records every GDN layer's rows, outputs and the requests'
   state blocks, step by step;
3. per layer, ``replay_check.check_layer`` replays the requests from the captured inputs
   (``prompt_state``, then ``replay_response``) and runs the control (``prompt_state`` over
   prompt + response: vLLM's chunk kernels on the response), comparing with what was served,
   bit for bit, on the GPU.

The orchestrating process writes ``{"provenance": {...}, "cases": [...]}`` (the cases of
replay_check.py; each engine's facts under ``provenance.engines``) and exits 0 when every replay
case has no differing element over responses of at least ``MIN_RESPONSE_TOKENS`` tokens and
every control case differs (``replay_check.verdict``).

``--smoke`` runs no engine: the synthetic engine of ``harness/replay_synthetic.py`` on the
CPU, through the same record building and comparison, with the CPU paths (CI).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from gdn_evidence.e2e.engine_options import add_engine_arguments, llm_kwargs
from gdn_evidence.e2e.engine_process import (
    EngineProcess,
    in_process_engine_env,
    run_engine_processes,
    start_engine_process,
    write_json,
    write_outcome,
)
from gdn_evidence.e2e.plugin_site import plugin_site
from gdn_evidence.e2e.preemption import plugin_summary, prompt_tokens
from gdn_evidence.harness.provenance import provenance
from gdn_evidence.harness.replay_capture import CaptureStore
from gdn_evidence.harness.replay_check import (
    MIN_RESPONSE_TOKENS,
    VLLM_PATHS,
    ReplayPaths,
    check_layer,
    results_table,
    verdict,
)
from gdn_evidence.harness.replay_synthetic import (
    CPU_PATHS,
    SMOKE_BUDGET,
    SMOKE_LAYERS,
    SMOKE_NEW_TOKENS,
    SMOKE_PROMPTS,
    serve_synthetic,
)
from vllm_gdn_invariant.models.weighted import MODELS, write_weighted_model

PROMPTS = (77, 200, 333, 513)  # 513 = 8 * 64 + 1: the grid's cut before a one-token tail
NEW_TOKENS = 96  # generated per request: 95 of them are fed back and replayed
MAX_NUM_BATCHED_TOKENS = 256
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 2048
DEFAULT_MODELS = "qwen3_next,qwen3_next_dims,qwen3_5"
MODE = "golden"


def engine_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """The engine's ``LLM`` arguments (module docstring)."""
    return llm_kwargs(
        spec,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=spec["max_num_batched_tokens"],
        max_num_seqs=MAX_NUM_SEQS,
        enable_prefix_caching=False,
        enforce_eager=True,
        async_scheduling=False,
    )


def check_store(
    model: str,
    store: CaptureStore,
    layers: list[str],
    prompts: list[int],
    new_tokens: int,
    paths: ReplayPaths,
) -> list[dict[str, Any]]:
    """Every layer's cases, requests in the order of ``prompts`` (told apart by their lengths,
    which must differ); each layer must hold every request with all its fed tokens."""
    if not store.steps:
        raise RuntimeError(
            "no step of a GDN layer was captured: _forward_core never ran (vLLM's CPU build "
            "runs forward_cpu; a CUDA graph replays steps without Python)"
        )
    cases = []
    for layer in layers:
        captured = {r.prompt_tokens: r for r in store.requests(layer).values()}
        if sorted(captured) != sorted(prompts):
            raise RuntimeError(
                f"layer {layer}: captured prompts of {sorted(captured)} tokens, "
                f"submitted {sorted(prompts)}"
            )
        requests = [captured[p] for p in prompts]
        short = [r.request for r in requests if r.response_tokens != new_tokens - 1]
        if short:
            raise RuntimeError(
                f"layer {layer}: requests {short} did not feed back "
                f"{new_tokens - 1} generated tokens"
            )
        cases += check_layer(model, layer, store.weights[layer], requests, paths)
    return cases


def step_facts(store: CaptureStore) -> dict[str, Any]:
    """How many steps were captured, how many mixed decode with prompt rows or held several
    requests, the most requests and rows in one step."""
    steps = store.steps
    return {
        "steps": len(steps),
        "steps_mixing_decode_and_prompt_rows": sum(s.mixes_decode_and_prompt_rows for s in steps),
        "steps_with_several_requests": sum(len(s.requests) > 1 for s in steps),
        "max_requests_per_step": max((len(s.requests) for s in steps), default=0),
        "max_rows_per_step": max((s.num_rows for s in steps), default=0),
    }


def engines_table(engines: dict[str, dict[str, Any]]) -> str:
    """The Markdown table of a file's engines: steps, how many mixed decode rows with prompt
    rows, the most requests in one step, the recurrent state's dtype."""
    lines = [
        "| model | steps | steps mixing decode and prompt rows | most requests in a step "
        "| recurrent state |",
        "| --- | --- | --- | --- | --- |",
    ]
    for model, facts in sorted(engines.items()):
        lines.append(
            f"| {model} | {facts['steps']} | {facts['steps_mixing_decode_and_prompt_rows']} "
            f"| {facts['max_requests_per_step']} | {facts.get('recurrent_state', '-')} |"
        )
    return "\n".join(lines)


def evidence_tables(record: dict[str, Any]) -> str:
    """What docs/replay.md shows of an evidence file: the cases' table, then the engines'."""
    return results_table(record["cases"]) + "\n\n" + engines_table(record["provenance"]["engines"])


def run_engine(spec: dict[str, Any]) -> dict[str, Any]:
    """One engine: generate with the capture on, then replay and compare every layer."""
    # vLLM only in the engine's process: the orchestrator and the --smoke run (CPU CI) do not
    # load vLLM's engine or model executor.
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    from gdn_evidence.e2e.gdn_capture import EngineCapture

    started = time.monotonic()
    llm = LLM(**engine_kwargs(spec))
    start_seconds = time.monotonic() - started
    config = llm.llm_engine.vllm_config
    vocab = config.model_config.get_vocab_size()
    prompts = [prompt_tokens(n, k, vocab) for k, n in enumerate(spec["prompts"])]
    params = SamplingParams(temperature=0.0, max_tokens=spec["new_tokens"], ignore_eos=True)
    store = CaptureStore()
    capture = EngineCapture(llm, store)
    started = time.monotonic()
    with capture.installed():
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
    generate_seconds = time.monotonic() - started
    started = time.monotonic()
    layers = sorted(capture.layers)
    with torch.inference_mode():
        cases = check_store(
            spec["model"], store, layers, list(spec["prompts"]), spec["new_tokens"], VLLM_PATHS
        )
    first = capture.layers[layers[0]]
    facts = {
        "model": spec["model"],
        "mode": os.environ.get("VLLM_GDN_INVARIANT_MODE"),
        "batch_invariant": os.environ.get("VLLM_BATCH_INVARIANT"),
        "plugin": plugin_summary(),
        "gdn_layers": layers,
        "generated_tokens": [len(o.outputs[0].token_ids) for o in outputs],
        "mamba_cache_mode": str(getattr(config.cache_config, "mamba_cache_mode", None)),
        "mamba_ssm_cache_dtype": str(config.cache_config.mamba_ssm_cache_dtype),
        "conv_state": f"{first.kv_cache[0].dtype}, dim first: {is_conv_state_dim_first()}",
        "recurrent_state": str(first.kv_cache[1].dtype),
        "cudagraph_mode": str(config.compilation_config.cudagraph_mode),
        "model_runner": type(capture.runner).__module__,
        "start_seconds": round(start_seconds, 1),
        "generate_seconds": round(generate_seconds, 2),
        "check_seconds": round(time.monotonic() - started, 2),
        **step_facts(store),
    }
    return {"engine": facts, "cases": cases}


def start_engine(
    model: str, args: argparse.Namespace, model_dir: Path, site: Path
) -> EngineProcess:
    """Start ``model``'s engine process; (process, result path, log path)."""
    spec = {
        "model": model,
        "model_dir": str(model_dir),
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "attention_backend": args.attention_backend,
        "prefill_backend": args.prefill_backend,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "kv_cache_gib": args.kv_cache_gib,
    }
    env = in_process_engine_env(site, mode=MODE, batch_invariant=True)
    return start_engine_process(
        "gdn_evidence.e2e.replay_engine", spec, env, prefix=f"gdn_replay_{model}_"
    )


def summary_line(case: dict[str, Any]) -> str:
    if "error" in case:
        return f"{case['model']}: ERROR {case['error']}"
    return (
        f"{case['model']} {case['layer']} request {case['request']} {case['kind']}: "
        f"{case['differing_elements']} of {case['compared_elements']} elements differ "
        f"({case['prompt_tokens']} prompt, {case['tokens']} response tokens)"
    )


def run_engines(args: argparse.Namespace, models: list[str]) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gdn_replay_"))
    site = plugin_site(workdir / "plugin-site")
    info = provenance(
        script="scripts/replay_engine_check.py",
        mode=MODE,
        batch_invariant=True,
        enforce_eager=True,
        prefix_caching=False,
        prompts=list(args.prompts),
        new_tokens=args.new_tokens,
        max_num_batched_tokens=args.max_num_batched_tokens,
        attention_backend=args.attention_backend or None,
        prefill_backend=args.prefill_backend or None,
        replay_path=VLLM_PATHS.prompt_name + ", then replay_response",
        control_path=VLLM_PATHS.control_name,
        engines={},
    )
    cases: list[dict[str, Any]] = []

    def start(model: str) -> EngineProcess:
        return start_engine(model, args, write_weighted_model(workdir / model, model), site)

    def finished(model: str, outcome: dict[str, Any], log: str) -> None:
        if "error" in outcome:
            outcome["cases"] = [
                {
                    "model": model,
                    "error": outcome["error"],
                    "trace": outcome.get("trace"),
                    "log_tail": log[-4000:],
                }
            ]
        else:
            info["engines"][model] = outcome["engine"]
        for case in outcome["cases"]:
            print(summary_line(case), flush=True)
        cases.extend(outcome["cases"])
        write_json(args.out, info, cases)

    run_engine_processes(models, start, finished, parallel=args.parallel, timeout=args.timeout)
    write_json(args.out, info, cases)
    problems = verdict(cases, MIN_RESPONSE_TOKENS)
    problems += [f"{m}: no cases" for m in models if not any(c["model"] == m for c in cases)]
    for problem in problems:
        print(f"FAIL {problem}", flush=True)
    return 0 if not problems else 1


def run_smoke(args: argparse.Namespace) -> int:
    """The synthetic engine on the CPU (harness/replay_synthetic.py), written like the engine
    run's file."""
    store = CaptureStore()
    serve_synthetic(store)
    cases = check_store(
        "synthetic", store, list(SMOKE_LAYERS), list(SMOKE_PROMPTS), SMOKE_NEW_TOKENS, CPU_PATHS
    )
    info = provenance(
        script="scripts/replay_engine_check.py",
        smoke=True,
        prompts=list(SMOKE_PROMPTS),
        new_tokens=SMOKE_NEW_TOKENS,
        budget=SMOKE_BUDGET,
        replay_path=CPU_PATHS.prompt_name + ", then replay_response",
        control_path=CPU_PATHS.control_name,
        engines={"synthetic": step_facts(store)},
    )
    write_json(args.out, info, cases)
    problems = verdict(cases, min_tokens=SMOKE_NEW_TOKENS - 1)
    for problem in problems:
        print(f"FAIL {problem}", flush=True)
    print(results_table(cases))
    return 0 if not problems else 1


def lengths(text: str) -> tuple[int, ...]:
    """``--prompts``: distinct comma-separated lengths of at least 2 tokens."""
    values = tuple(int(v) for v in text.split(",") if v)
    if not values or min(values) < 2 or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError("distinct prompt lengths of at least 2 tokens")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replay_engine_check.py",
        description="Capture every GDN layer in vLLM's engine (mode golden, batch invariant) "
        "and replay it with prompt_state and replay_response, bit for bit, with a control.",
    )
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--prompts", type=lengths, default=PROMPTS, help="prompt lengths")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--max-num-batched-tokens", type=int, default=MAX_NUM_BATCHED_TOKENS)
    parser.add_argument("--parallel", type=int, default=3, help="engines running at once")
    parser.add_argument("--timeout", type=float, default=260.0, help="seconds for all engines")
    parser.add_argument("--workdir", type=Path, default=None)
    add_engine_arguments(parser, gpu_memory_utilization=0.12, kv_cache_gib=2.0)
    parser.add_argument("--smoke", action="store_true", help="the synthetic engine, CPU (CI)")
    parser.add_argument(
        "--table", type=Path, default=None, help="print the results table of this JSON file"
    )
    parser.add_argument("--run-engine", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.run_engine is not None:
        write_outcome(run_engine, args.run_engine, args.result)
        return 0
    if args.table is not None:
        print(evidence_tables(json.loads(args.table.read_text())))
        return 0
    if args.out is None:
        parser.error("--out is required")
    if args.smoke:
        return run_smoke(args)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        parser.error(f"--models: {', '.join(unknown)} not among {', '.join(MODELS)}")
    if args.new_tokens < 2 or max(args.prompts) + args.new_tokens > MAX_MODEL_LEN:
        parser.error(f"--new-tokens: 2 or more, prompt + new tokens <= {MAX_MODEL_LEN}")
    return run_engines(args, models)


if __name__ == "__main__":
    sys.exit(main())
