"""Preempted requests keep their bits: forced and natural preemption in a real vLLM engine.

One engine per (model, CUDA graphs, plugin mode), each in its own process, with
``VLLM_BATCH_INVARIANT=1`` and the plugin, its engine core in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that the runner reaches vLLM's scheduler as
vLLM's own preemption test does. In that one engine:

* ``forced`` (the shape of ``tests/v1/determinism/test_mamba2_preemption.py`` in vLLM):
  three prompts of 513, 514 and 770 tokens, each first generated alone (the uninterrupted
  run); then two of them together, preempted by ``reset_prefix_cache(reset_running_requests=
  True)`` after 8 and after 31 generated tokens of the first, the third added two steps into
  the recovery so that one step mixes a prompt rebuild with a history replay; the whole run
  twice. Every request's tokens and top-5 logprobs of every step are compared, bit for bit,
  with its uninterrupted run.
* ``natural``: a KV cache of ``kv_blocks`` blocks (a few requests' worth), 24 prompts
  generating ``NATURAL_NEW_TOKENS`` each at once; the scheduler preempts under the KV
  pressure. Eight of them, generated alone first, are compared.


With prefix caching on (the ``graphs`` setting, align mode):

* ``forced-cached``: the forced shape with ``CACHED_NEW_TOKENS`` per request, preempted after
  ``CACHED_PREEMPT_AT`` generated tokens of the first request the way KV pressure does it
  (vLLM's ``reset_prefix_cache(reset_running_requests=True)`` with the cache kept): the
  resumed requests find their own cached blocks, decode-built ones past their prompts
  included, and replay their history from there. Resume hits are counted.
* ``multi-turn``: a request answers (``MULTI_TURN_NEW_TOKENS``), then the next turn's prompt
  (prompt, answer, ``MULTI_TURN_SUFFIX`` more tokens) runs twice: right after, with the
  answer's blocks cached, and after ``reset_prefix_cache()``, computed from scratch. The two
  must agree: the next turn never starts from the answer's decode-built state.

Arms: ``replay`` (the plugin as installed) and ``control``, the same engine with the replay
switched off in-process (the scheduler's prompt-end rule, the builder's history plans and the
cache key of blocks past a prompt removed: a recomputed request then runs the chunk kernels
over its generated tokens), which must differ. The replay's cost is timed around its decode
steps (device synchronized).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
from vllm_gdn_invariant.models.weighted import MODELS, write_weighted_model

FORCED_PROMPTS = (513, 514, 770)
FORCED_NEW_TOKENS = 64
FORCED_RESETS_AT = (8, 31)  # generated tokens of the first request at each forced preemption
FORCED_REPEATS = 2
NATURAL_PROMPTS = 24
NATURAL_NEW_TOKENS = 448
NATURAL_SAMPLED = (0, 3, 7, 10, 13, 17, 20, 23)
# forced-cached: enough tokens that the second preemption comes after a block boundary past
# every model's prompt (align blocks of 192 and 320 tokens, first prompt 513)
CACHED_NEW_TOKENS = 192
CACHED_PREEMPT_AT = (40, 140)
MULTI_TURN_NEW_TOKENS = 128
MULTI_TURN_SUFFIX = 40
CACHED_KINDS = ("forced-cached", "multi-turn")
TOP_LOGPROBS = 5
MAX_MODEL_LEN = 2048
MAX_NUM_BATCHED_TOKENS = 1024
MAX_NUM_SEQS = 32
MODES = ("route", "golden")
# KV blocks per engine: a few requests' worth (blocks hold one mamba state per GDN group
# and request, or block_size tokens of attention KV; align mode keeps one state per block).
KV_BLOCKS = {
    ("qwen3_next", False): 32,
    ("qwen3_next", True): 64,
    ("qwen3_5", False): 32,
    ("qwen3_5", True): 64,
    ("qwen3_next_dims", False): 24,
    ("qwen3_next_dims", True): 40,
}


@dataclass(frozen=True)
class EngineCase:
    model: str
    cuda_graphs: bool
    mode: str
    model_runner: str = "default"  # "v1", "v2": VLLM_USE_V2_MODEL_RUNNER=0/1; vLLM's choice

    @property
    def name(self) -> str:
        setting = "graphs" if self.cuda_graphs else "eager"
        runner = "" if self.model_runner == "default" else f"-{self.model_runner}"
        return f"{self.model}-{setting}-{self.mode}{runner}"


def prompt_tokens(length: int, k: int, vocab: int) -> list[int]:
    """A deterministic prompt of ``length`` token ids in [4, vocab) (past the special ids)."""
    return [4 + (911 * 131 + i * 17 + k * 101) % (vocab - 4) for i in range(length)]


def natural_lengths() -> list[int]:
    return [64 + (i * 149) % 449 for i in range(NATURAL_PROMPTS)]


def signature(output: Any) -> dict[str, Any]:
    """Tokens and, per step, each top logprob's float32 bits (hex)."""
    completion = output.outputs[0]
    rows = []
    for row in completion.logprobs or []:
        rows.append({str(t): struct.pack("<f", v.logprob).hex() for t, v in sorted(row.items())})
    return {"tokens": list(completion.token_ids), "logprobs": rows}


def first_divergence(a: dict[str, Any], b: dict[str, Any]) -> int | None:
    """The first step whose token or top logprobs differ (None: identical)."""
    steps = max(len(a["tokens"]), len(b["tokens"]))
    for i in range(steps):
        ta = a["tokens"][i] if i < len(a["tokens"]) else None
        tb = b["tokens"][i] if i < len(b["tokens"]) else None
        la = a["logprobs"][i] if i < len(a["logprobs"]) else None
        lb = b["logprobs"][i] if i < len(b["logprobs"]) else None
        if ta != tb or la != lb:
            return i
    return None


class EngineProbe:
    """Counts and observations on the in-process engine: preemptions, steps that mix a
    prompt rebuild with generated history, the replay's tokens and time."""

    def __init__(self, llm: Any) -> None:
        from vllm_gdn_invariant.patches import replayed_forward_core

        self.engine = llm.llm_engine
        self.scheduler = self.engine.engine_core.engine_core.scheduler
        self.preemptions = 0
        self.mixed_steps = 0
        self.replay_steps = 0
        self.replay_tokens = 0
        self.replay_seconds = 0.0
        preempt = self.scheduler._preempt_request
        schedule = self.scheduler.schedule

        def count_preemption(request: Any, *args: Any, **kwargs: Any) -> None:
            self.preemptions += 1
            preempt(request, *args, **kwargs)

        def observe(*args: Any, **kwargs: Any) -> Any:
            before = {
                key: (r.num_computed_tokens, r.num_prompt_tokens)
                for key, r in self.scheduler.requests.items()
            }
            output = schedule(*args, **kwargs)
            prompt = history = False
            for key, count in output.num_scheduled_tokens.items():
                computed, boundary = before.get(key, (0, 0))
                if count > 1:
                    prompt |= computed < boundary
                    history |= computed >= boundary
            self.mixed_steps += prompt and history
            return output

        def timed(replay):
            def timed_replay(layer, attn_metadata, plan, *tensors):
                import torch

                sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
                sync()
                start = time.perf_counter()
                replay(layer, attn_metadata, plan, *tensors)
                sync()
                self.replay_seconds += time.perf_counter() - start
                self.replay_steps += 1
                self.replay_tokens += plan.num_tokens

            return timed_replay

        manager = self.scheduler.kv_cache_manager
        lookup = manager.get_computed_blocks
        self.resumes: list[dict[str, int]] = []

        def observe_lookup(request: Any, *args: Any, **kwargs: Any) -> Any:
            result = lookup(request, *args, **kwargs)
            if request.num_preemptions:
                self.resumes.append(
                    {
                        "prompt": request.num_prompt_tokens,
                        "tokens": request.num_tokens,
                        "hit": int(result[1]),
                    }
                )
            return result

        self.scheduler._preempt_request = count_preemption
        self.scheduler.schedule = observe
        manager.get_computed_blocks = observe_lookup
        # both replays: per token position (mode route), in one call (mode golden)
        for name in ("replay_history", "replay_history_in_one_call"):
            setattr(replayed_forward_core, name, timed(getattr(replayed_forward_core, name)))

    def reset(self) -> None:
        self.preemptions = self.mixed_steps = self.replay_steps = self.replay_tokens = 0
        self.replay_seconds = 0.0
        self.resumes = []

    def preempt_keeping_the_cache(self) -> None:
        """Preempt every running request as KV pressure does: blocks freed, the prefix cache
        kept (``reset_prefix_cache(reset_running_requests=True)`` without the reset)."""
        manager = self.scheduler.kv_cache_manager
        manager.reset_prefix_cache = lambda: True
        try:
            if not self.scheduler.reset_prefix_cache(reset_running_requests=True):
                raise RuntimeError("preempting the running requests failed")
        finally:
            del manager.reset_prefix_cache

    def counts(self) -> dict[str, Any]:
        return {
            "preemptions": self.preemptions,
            "mixed_rebuild_and_history_steps": self.mixed_steps,
            "replayed_layer_calls": self.replay_steps,
            "replayed_tokens_all_layers": self.replay_tokens,
            "replay_seconds": round(self.replay_seconds, 4),
            "resumes": len(self.resumes),
            "resumes_with_hit": sum(r["hit"] > 0 for r in self.resumes),
            "resumes_with_hit_past_prompt": sum(r["hit"] > r["prompt"] for r in self.resumes),
            "resume_hits": self.resumes[:16],
        }

    @contextlib.contextmanager
    def replay_switched_off(self) -> Iterator[None]:
        """The control arm: no prompt-end rule in the scheduler, no history plans, no cache
        key for blocks past a prompt."""
        from vllm_gdn_invariant.patches import history_cache_key, history_replay
        from vllm_gdn_invariant.patches.bi_chunk_grid import HISTORY_ATTR

        had_rule = hasattr(self.scheduler, HISTORY_ATTR)
        plan = history_replay.history_plan
        salting = history_cache_key.salting()
        if had_rule:
            delattr(self.scheduler, HISTORY_ATTR)
        history_replay.history_plan = lambda *args: None
        history_cache_key.salt_generated_blocks(False)
        try:
            yield
        finally:
            history_cache_key.salt_generated_blocks(salting)
            history_replay.history_plan = plan
            if had_rule:
                setattr(self.scheduler, HISTORY_ATTR, True)


def run_forced(
    llm: Any,
    probe: EngineProbe,
    params: Any,
    prompts: list,
    baseline: list,
    arm: str,
    kind: str = "forced",
    preempt_at: tuple[int, ...] = FORCED_RESETS_AT,
) -> list[dict[str, Any]]:
    """The forced case, ``FORCED_REPEATS`` times; one record per repeat. ``kind`` "forced"
    preempts by ``reset_prefix_cache(reset_running_requests=True)``, "forced-cached" keeps
    the prefix cache."""
    engine, scheduler = probe.engine, probe.scheduler
    records = []
    for repeat in range(FORCED_REPEATS):
        probe.reset()
        requests: dict[int, Any] = {}
        finals: dict[int, dict[str, Any]] = {}
        labels = {f"{arm}-{kind}-{repeat}-{k}": k for k in range(len(prompts))}
        resets = 0
        recovery_steps = None
        started = time.perf_counter()

        def add(k: int, repeat: int = repeat, requests: dict = requests) -> None:
            request_id = f"{arm}-{kind}-{repeat}-{k}"
            key = engine.add_request(request_id, prompts[k], params)
            requests[k] = scheduler.requests[key if isinstance(key, str) else request_id]

        add(0)
        add(1)
        for _ in range(5000):
            if not engine.has_unfinished_requests():
                break
            for output in engine.step():
                if output.finished:
                    finals[labels[output.request_id]] = signature(output)
            if recovery_steps is not None:
                recovery_steps += 1
                if recovery_steps == 2 and 2 not in requests:
                    add(2)
            if resets < len(preempt_at) and requests[0].num_output_tokens == preempt_at[resets]:
                if kind == "forced-cached":
                    probe.preempt_keeping_the_cache()
                elif not llm.reset_prefix_cache(reset_running_requests=True):
                    raise RuntimeError("reset_prefix_cache(reset_running_requests=True) failed")
                resets += 1
                recovery_steps = 0
        else:
            raise RuntimeError(f"the {kind} case made no bounded progress")
        divergences = [first_divergence(finals[k], baseline[k]) for k in range(len(prompts))]
        records.append(
            {
                "kind": kind,
                "arm": arm,
                "repeat": repeat,
                "compared": len(prompts),
                "identical": sum(d is None for d in divergences),
                "first_divergence": divergences,
                "resets": resets,
                "seconds": round(time.perf_counter() - started, 2),
                **probe.counts(),
            }
        )
    return records


def run_multi_turn(llm: Any, probe: EngineProbe, prompt: list[int], arm: str) -> dict[str, Any]:
    """The next turn of a conversation, with its previous answer cached and from scratch."""
    # vLLM only in the engine's process (as run_engine)
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    probe.reset()
    started = time.perf_counter()
    answer_params = SamplingParams(
        temperature=0.0, max_tokens=MULTI_TURN_NEW_TOKENS, ignore_eos=True
    )
    turn_params = SamplingParams(
        temperature=0.0, max_tokens=FORCED_NEW_TOKENS, ignore_eos=True, logprobs=TOP_LOGPROBS
    )
    if not llm.reset_prefix_cache():
        raise RuntimeError("reset_prefix_cache() failed")
    answer = llm.generate([TokensPrompt(prompt_token_ids=prompt)], answer_params, use_tqdm=False)
    suffix = [4 + (7 * i) % 50 for i in range(MULTI_TURN_SUFFIX)]
    turn = TokensPrompt(prompt_token_ids=prompt + list(answer[0].outputs[0].token_ids) + suffix)
    cached = llm.generate([turn], turn_params, use_tqdm=False)[0]
    if not llm.reset_prefix_cache():
        raise RuntimeError("reset_prefix_cache() failed")
    fresh = llm.generate([turn], turn_params, use_tqdm=False)[0]
    divergence = first_divergence(signature(cached), signature(fresh))
    return {
        "kind": "multi-turn",
        "arm": arm,
        "compared": 1,
        "identical": int(divergence is None),
        "first_divergence": [divergence],
        "previous_prompt": len(prompt),
        "turn_prompt": len(turn["prompt_token_ids"]),
        "turn_cached_tokens": cached.num_cached_tokens,
        "fresh_cached_tokens": fresh.num_cached_tokens,
        "seconds": round(time.perf_counter() - started, 2),
        **probe.counts(),
    }


def run_natural(llm: Any, probe: EngineProbe, params: Any, prompts: list, alone: dict, arm: str):
    probe.reset()
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    divergences = [first_divergence(signature(outputs[i]), alone[i]) for i in NATURAL_SAMPLED]
    return {
        "kind": "natural",
        "arm": arm,
        "compared": len(NATURAL_SAMPLED),
        "identical": sum(d is None for d in divergences),
        "first_divergence": divergences,
        "seconds": round(seconds, 2),
        **probe.counts(),
    }


def engine_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """A case's ``LLM`` arguments: vLLM's defaults with CUDA graphs (prefix caching on) or
    eager without prefix caching, a KV cache of ``kv_blocks`` blocks."""
    return llm_kwargs(
        spec,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        max_num_seqs=MAX_NUM_SEQS,
        enable_prefix_caching=spec["cuda_graphs"],
        enforce_eager=not spec["cuda_graphs"],
        num_gpu_blocks_override=spec["kv_blocks"],
        async_scheduling=False,
    )


def plugin_summary() -> str | None:
    """The plugin's one line for this process (the engine runs in it)."""
    from vllm_gdn_invariant.plugin.entry import registered_status

    status = registered_status()
    return None if status is None else status.summary()


def run_engine(spec: dict[str, Any]) -> dict[str, Any]:
    """One engine: baselines, then forced and natural preemption in both arms."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    started = time.monotonic()
    llm = LLM(**engine_kwargs(spec))
    start_seconds = time.monotonic() - started
    probe = EngineProbe(llm)
    config = llm.llm_engine.vllm_config
    vocab = config.model_config.get_vocab_size()
    facts = {
        "block_size": config.cache_config.block_size,
        "mamba_cache_mode": str(getattr(config.cache_config, "mamba_cache_mode", None)),
        "mamba_ssm_cache_dtype": str(config.cache_config.mamba_ssm_cache_dtype),
        "cudagraph_mode": str(config.compilation_config.cudagraph_mode),
        "kv_blocks": probe.scheduler.kv_cache_manager.block_pool.num_gpu_blocks,
        "model_runner": "v1" if not getattr(config, "use_v2_model_runner", True) else "v2",
        "start_seconds": round(start_seconds, 1),
        "plugin": plugin_summary(),
    }
    forced_params = SamplingParams(
        temperature=0.0, max_tokens=FORCED_NEW_TOKENS, ignore_eos=True, logprobs=TOP_LOGPROBS
    )
    forced_prompts = [
        TokensPrompt(prompt_token_ids=prompt_tokens(n, k, vocab))
        for k, n in enumerate(FORCED_PROMPTS)
    ]
    forced_baseline = [
        signature(llm.generate([p], forced_params, use_tqdm=False)[0]) for p in forced_prompts
    ]
    natural_params = SamplingParams(
        temperature=0.0,
        max_tokens=spec["natural_new_tokens"],
        ignore_eos=True,
        logprobs=TOP_LOGPROBS,
    )
    natural_prompts = [
        TokensPrompt(prompt_token_ids=prompt_tokens(n, 7 + k, vocab))
        for k, n in enumerate(natural_lengths())
    ]
    probe.reset()
    natural_alone = {
        i: signature(llm.generate([natural_prompts[i]], natural_params, use_tqdm=False)[0])
        for i in NATURAL_SAMPLED
    }
    facts["preemptions_in_alone_runs"] = probe.preemptions
    cached = bool(config.cache_config.enable_prefix_caching)
    if cached:
        cached_params = SamplingParams(
            temperature=0.0, max_tokens=CACHED_NEW_TOKENS, ignore_eos=True, logprobs=TOP_LOGPROBS
        )
        cached_baseline = [
            signature(llm.generate([p], cached_params, use_tqdm=False)[0]) for p in forced_prompts
        ]
    results = []
    for arm in ("replay", "control"):
        switch = probe.replay_switched_off() if arm == "control" else contextlib.nullcontext()
        with switch:
            results += run_forced(llm, probe, forced_params, forced_prompts, forced_baseline, arm)
            results.append(
                run_natural(llm, probe, natural_params, natural_prompts, natural_alone, arm)
            )
            if cached:
                results += run_forced(
                    llm,
                    probe,
                    cached_params,
                    forced_prompts,
                    cached_baseline,
                    arm,
                    kind="forced-cached",
                    preempt_at=CACHED_PREEMPT_AT,
                )
                results.append(
                    run_multi_turn(llm, probe, forced_prompts[0]["prompt_token_ids"], arm)
                )
    return {"engine": facts, "results": results}


def case_records(case: EngineCase, outcome: dict[str, Any], log: str) -> list[dict[str, Any]]:
    common = {
        "model": case.model,
        "cuda_graphs": case.cuda_graphs,
        "mode": case.mode,
        "model_runner_asked": case.model_runner,
    }
    if "error" in outcome:
        return [{**common, "error": outcome["error"], "log_tail": log[-4000:]}]
    lines = [line.strip() for line in log.splitlines() if "gdn_invariant" in line]
    return [
        {**common, **result, "engine": outcome["engine"], "plugin_log": lines[:4]}
        for result in outcome["results"]
    ]


def start_engine(
    case: EngineCase, args: argparse.Namespace, model_dir: Path, site: Path
) -> EngineProcess:
    """Start ``case``'s engine process; (process, result path, log path)."""
    spec = {
        **asdict(case),
        "model_dir": str(model_dir),
        "kv_blocks": KV_BLOCKS[(case.model, case.cuda_graphs)],
        "attention_backend": args.attention_backend,
        "prefill_backend": args.prefill_backend,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "natural_new_tokens": args.natural_new_tokens,
    }
    env = in_process_engine_env(site, mode=case.mode, batch_invariant=args.batch_invariant)
    if case.model_runner != "default":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if case.model_runner == "v2" else "0"
    return start_engine_process(
        "gdn_evidence.e2e.preemption", spec, env, prefix=f"gdn_preempt_{case.name}_"
    )


def merge(out: Path, inputs: list[Path]) -> None:
    """Combine files of this script into ``out``: every case, each input's provenance kept
    under ``provenance.runs``."""
    runs, cases = [], []
    for path in inputs:
        data = json.loads(path.read_text())
        runs.append({"file": path.name, **data["provenance"]})
        cases += data["cases"]
    write_json(out, {"merged_from": [p.name for p in inputs], "runs": runs}, cases)


def results_table(records: list[dict[str, Any]]) -> str:
    """The Markdown table of a file's records: per engine, identical/compared and preemptions
    for each kind and arm, summed over the forced repeats."""
    cells: dict[tuple, dict[tuple, list[int]]] = {}
    for r in records:
        if "error" in r:
            continue
        runner = r.get("engine", {}).get("model_runner", "v1")
        engine = (r["model"], "graphs" if r["cuda_graphs"] else "eager", r["mode"], runner)
        total = cells.setdefault(engine, {}).setdefault((r["kind"], r["arm"]), [0, 0, 0])
        total[0] += r["identical"]
        total[1] += r["compared"]
        total[2] += r["preemptions"]
    columns = [
        ("forced", "replay"),
        ("forced", "control"),
        ("natural", "replay"),
        ("natural", "control"),
    ]
    if any(r.get("kind") in CACHED_KINDS for r in records):
        columns += [(kind, arm) for kind in CACHED_KINDS for arm in ("replay", "control")]
    lines = [
        "| model | setting | mode | runner | " + " | ".join(f"{k} {a}" for k, a in columns) + " |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in columns) + " |",
    ]
    for engine in sorted(cells):
        row = []
        for kind, arm in columns:
            if (kind, arm) not in cells[engine]:
                row.append("-")
                continue
            same, compared, preempted = cells[engine][(kind, arm)]
            row.append(
                f"{same}/{compared}"
                if kind == "multi-turn"
                else f"{same}/{compared} ({preempted} preemptions)"
            )
        lines.append("| " + " | ".join(engine) + " | " + " | ".join(row) + " |")
    return "\n".join(lines)


def summary_line(record: dict[str, Any]) -> str:
    head = f"{record['model']} {'graphs' if record['cuda_graphs'] else 'eager'} {record['mode']}"
    if record.get("model_runner_asked", "default") != "default":
        head += f" runner {record['model_runner_asked']}"
    if "error" in record:
        return f"{head}: ERROR {record['error']}"
    return (
        f"{head} {record['kind']} {record['arm']}: {record['identical']}/{record['compared']} "
        f"identical, {record['preemptions']} preemptions, first divergence "
        f"{record['first_divergence']}, replay {record['replayed_tokens_all_layers']} tokens "
        f"in {record['replay_seconds']} s"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="preemption_determinism.py",
        description="Forced and natural preemption in a real vLLM engine, with and without the "
        "history replay; tokens and top-5 logprobs compared bitwise with uninterrupted runs.",
    )
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--models", default="qwen3_next,qwen3_5,qwen3_next_dims")
    parser.add_argument("--graphs", default="eager,graphs", help="eager, graphs or both")
    parser.add_argument("--modes", default="route,golden")
    parser.add_argument(
        "--model-runner",
        choices=("default", "v1", "v2"),
        default="default",
        help="vLLM's model runner (VLLM_USE_V2_MODEL_RUNNER=0/1; default: vLLM's choice)",
    )
    parser.add_argument("--parallel", type=int, default=6, help="engines running at once")
    parser.add_argument("--timeout", type=float, default=560.0, help="seconds for all engines")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--natural-new-tokens",
        type=int,
        default=NATURAL_NEW_TOKENS,
        help="tokens each natural-case request generates (fewer: a quicker smoke run)",
    )
    parser.add_argument(
        "--no-batch-invariant",
        dest="batch_invariant",
        action="store_false",
        help="without VLLM_BATCH_INVARIANT=1 (vLLM's CPU build refuses it for Qwen3-Next: a "
        "smoke run of the protocol)",
    )
    add_engine_arguments(parser, gpu_memory_utilization=0.08)
    parser.add_argument(
        "--merge", type=Path, nargs="+", default=None, help="combine these JSON files into --out"
    )
    parser.add_argument(
        "--table", type=Path, default=None, help="print the results table of this JSON file"
    )
    parser.add_argument("--run-engine", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser


def cases_from(args: argparse.Namespace) -> list[EngineCase]:
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"--models: {', '.join(unknown)} not among {', '.join(MODELS)}")
    graphs = {"eager": False, "graphs": True}
    settings = [g for g in args.graphs.split(",") if g]
    if any(g not in graphs for g in settings):
        raise ValueError("--graphs: eager, graphs")
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes):
        raise ValueError(f"--modes: {', '.join(MODES)}")
    return [
        EngineCase(m, graphs[g], mode, args.model_runner)
        for m in models
        for g in settings
        for mode in modes
    ]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.run_engine is not None:
        write_outcome(run_engine, args.run_engine, args.result)
        return 0
    if args.table is not None:
        print(results_table(json.loads(args.table.read_text())["cases"]))
        return 0
    if args.out is None:
        parser.error("--out is required")
    if args.merge:
        missing = [str(p) for p in args.merge if not p.is_file()]
        if missing:
            parser.error(f"--merge: no such file: {', '.join(missing)}")
        merge(args.out, args.merge)
        return 0
    try:
        cases = cases_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    from gdn_evidence.harness.provenance import provenance

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gdn_preempt_"))
    site = plugin_site(workdir / "plugin-site")
    model_dirs = {
        m: write_weighted_model(workdir / m, m) for m in dict.fromkeys(c.model for c in cases)
    }
    info = provenance(
        script="scripts/preemption_determinism.py",
        forced_prompts=list(FORCED_PROMPTS),
        forced_new_tokens=FORCED_NEW_TOKENS,
        forced_resets_at=list(FORCED_RESETS_AT),
        natural_prompt_lengths=natural_lengths(),
        natural_new_tokens=args.natural_new_tokens,
        natural_sampled=list(NATURAL_SAMPLED),
        cached_new_tokens=CACHED_NEW_TOKENS,
        cached_preempt_at=list(CACHED_PREEMPT_AT),
        multi_turn_new_tokens=MULTI_TURN_NEW_TOKENS,
        multi_turn_suffix=MULTI_TURN_SUFFIX,
        top_logprobs=TOP_LOGPROBS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        attention_backend=args.attention_backend or None,
        prefill_backend=args.prefill_backend or None,
        batch_invariant=args.batch_invariant,
        kv_blocks={f"{m}-{'graphs' if g else 'eager'}": n for (m, g), n in KV_BLOCKS.items()},
    )
    records: list[dict[str, Any]] = []

    def start(case: EngineCase) -> EngineProcess:
        return start_engine(case, args, model_dirs[case.model], site)

    def finished(case: EngineCase, outcome: dict[str, Any], log: str) -> None:
        for record in case_records(case, outcome, log):
            records.append(record)
            print(summary_line(record), flush=True)
        write_json(args.out, info, records)

    run_engine_processes(cases, start, finished, parallel=args.parallel, timeout=args.timeout)
    write_json(args.out, info, records)
    replay = [r for r in records if r.get("arm") == "replay"]
    control = [r for r in records if r.get("arm") == "control"]
    ok = (
        all(r["identical"] == r["compared"] for r in replay)
        and all(r["identical"] < r["compared"] for r in control)
        and not any("error" in r for r in records)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
