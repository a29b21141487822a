"""End-to-end batch invariance in a real vLLM engine: a target prompt alone vs among 31 others.

Each case is one engine in its own process (the plugin patches the process it loads in, and
an engine that refuses to start must not take the others with it): a model (tiny Qwen3-Next
or Qwen3.5 with seeded random weights, ``models/weighted.py``), an arm, an engine setting and
a tensor-parallel size. The engine generates greedily 64 tokens with logprobs for the target
alone, then for the target among 31 concurrent prompts of mixed lengths under a token budget
that splits prompts (chunked prefill) and mixes prefills with decodes; tokens and the sampled
tokens' logprobs are compared bit for bit.

Arms (``ARMS``): 1 vLLM alone; 2 the plugin (mode route); 3 vLLM alone with
``VLLM_BATCH_INVARIANT=1`` (expected: refused at startup); 4 the plugin with
``VLLM_BATCH_INVARIANT=1`` (expected: identical); 5 the negative control, arm 4 without the
routing patch (expected: different). Engine settings (``SETTINGS``): ``default`` (torch.compile
and CUDA graphs on, prefix caching on: vLLM's default configuration with prefix caching
enabled) and ``eager`` (``enforce_eager``, prefix caching off). Arms 1-3 run ``eager``.

The JSON is rewritten after every case (a device call ends at 600 s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gdn_evidence.e2e.engine_options import add_engine_arguments, llm_kwargs
from gdn_evidence.e2e.plugin_site import (
    CONTROL_WITHOUT_ROUTING,
    PLUGIN,
    engine_env,
    plugin_site,
)
from gdn_evidence.e2e.ranks import CPU_BINDING_ENV, check_tensor_parallel, visible_gpus
from vllm_gdn_invariant.models.tiny import words
from vllm_gdn_invariant.models.weighted import (
    MODELS,
    tensor_parallel_problems,
    write_weighted_model,
)

NEW_TOKENS = 64
TARGET_WORDS = 700
TARGET_INDEX = 20  # the target's place among the prompts: after enough to be split
# 31 other prompts of mixed lengths (words = tokens), 16 to 1800 tokens.
OTHER_WORDS = (
    1500, 37, 900, 5, 1200, 64, 333, 1800, 16, 700, 129, 450, 1000, 77, 256, 1600,
    48, 610, 190, 1100, 22, 830, 500, 95, 1400, 300, 60, 999, 140, 710, 17,
)  # fmt: skip
MAX_MODEL_LEN = 2048
MAX_NUM_BATCHED_TOKENS = 2048
GPU_MEMORY_UTILIZATION = 0.5
REFUSAL_PATTERNS = (
    re.compile(r"VLLM batch_invariant mode is not supported for \S+?\.?(?: \(.*\))?$"),
    re.compile(r"\b\w*(?:Error|Exception): .+$"),
)


@dataclass(frozen=True)
class Arm:
    number: int
    plugins: tuple[str, ...]
    batch_invariant: bool
    meaning: str
    expected: str | None  # "identical", "different", "refused", or None (observed only)
    settings: tuple[str, ...]


@dataclass(frozen=True)
class Setting:
    name: str
    cuda_graphs: bool
    prefix_caching: bool


SETTINGS = {
    "default": Setting("default", cuda_graphs=True, prefix_caching=True),
    "eager": Setting("eager", cuda_graphs=False, prefix_caching=False),
}
ARMS = {
    1: Arm(1, (), False, "vLLM alone", None, ("eager",)),
    2: Arm(2, (PLUGIN,), False, "plugin (mode route)", None, ("eager",)),
    3: Arm(3, (), True, "vLLM alone, VLLM_BATCH_INVARIANT=1", "refused", ("eager",)),
    4: Arm(4, (PLUGIN,), True, "plugin, VLLM_BATCH_INVARIANT=1", "identical", ("default", "eager")),
    5: Arm(
        5,
        (CONTROL_WITHOUT_ROUTING,),
        True,
        "negative control: arm 4 without the routing patch",
        "different",
        ("default", "eager"),
    ),
}


@dataclass(frozen=True)
class Case:
    model: str
    arm: int
    setting: str
    tensor_parallel_size: int = 1

    @property
    def key(self) -> tuple:
        return (self.model, self.arm, self.setting, self.tensor_parallel_size)


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]


def float_bits(values: list[float]) -> list[str]:
    """The IEEE-754 bits of each value (as vLLM returns it, a Python float), in hex."""
    return [struct.pack(">d", v).hex() for v in values]


def compare(alone: Completion, batched: Completion) -> dict[str, Any]:
    """Tokens and logprobs compared bit for bit; the first position where either differs."""
    alone_bits, batched_bits = float_bits(alone.logprobs), float_bits(batched.logprobs)
    n = max(len(alone.token_ids), len(batched.token_ids))
    first = None
    for i in range(n):
        same_token = i < len(alone.token_ids) and i < len(batched.token_ids)
        same_token = same_token and alone.token_ids[i] == batched.token_ids[i]
        same_bits = i < len(alone_bits) and i < len(batched_bits)
        same_bits = same_bits and alone_bits[i] == batched_bits[i]
        if not (same_token and same_bits):
            first = i
            break
    return {
        "tokens_identical": alone.token_ids == batched.token_ids,
        "logprobs_identical": alone.token_ids == batched.token_ids and alone_bits == batched_bits,
        "first_divergence": first,
    }


def prompts() -> tuple[str, list[str]]:
    """The target and the 32 prompts of the batched run (the target at ``TARGET_INDEX``)."""
    target = words(TARGET_WORDS, start=11)
    others = [words(n, start=37 * i) for i, n in enumerate(OTHER_WORDS)]
    batch = others[:TARGET_INDEX] + [target] + others[TARGET_INDEX:]
    return target, batch


def expectation_met(arm: Arm, result: dict[str, Any]) -> bool | None:
    """Whether the case came out as its arm expects; an observed arm (no expectation) is only
    expected to start."""
    if arm.expected is None:
        return False if result.get("refused") is not None else None
    if arm.expected == "refused":
        return result.get("refused") is not None
    if result.get("refused") is not None:
        return False
    identical = bool(result["tokens_identical"] and result["logprobs_identical"])
    return identical if arm.expected == "identical" else not identical


def root_cause(log: str) -> str | None:
    """The line of an engine's log that says why it did not start."""
    lines = [line.strip() for line in log.splitlines()]
    for pattern in REFUSAL_PATTERNS:
        for line in lines:
            match = pattern.search(line)
            if match and "Engine core initialization failed" not in line:
                return match.group(0)
    return None


def plugin_lines(log: str) -> list[str]:
    """The plugin's (and the controls') one-line reports, one per process."""
    return [line.strip() for line in log.splitlines() if "gdn_invariant" in line and "[pid" in line]


# --- one case, in its own process -------------------------------------------------------------


def engine_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """A case's ``LLM`` arguments: its setting's prefix caching and CUDA graphs, its TP size."""
    setting = SETTINGS[spec["setting"]]
    return llm_kwargs(
        spec,
        tensor_parallel_size=spec["tensor_parallel_size"],
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        enable_prefix_caching=setting.prefix_caching,
        enforce_eager=not setting.cuda_graphs,
    )


def engine_facts(llm: Any) -> dict[str, Any]:
    """What the engine ran with, as vLLM's config says (best effort)."""
    try:
        config = llm.llm_engine.vllm_config
        cache = config.cache_config
        compilation = config.compilation_config
        return {
            "block_size": cache.block_size,
            "mamba_cache_mode": str(getattr(cache, "mamba_cache_mode", None)),
            "mamba_ssm_cache_dtype": str(cache.mamba_ssm_cache_dtype),
            "compilation_mode": str(compilation.mode),
            "cudagraph_mode": str(compilation.cudagraph_mode),
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "additional_config": config.additional_config,
        }
    except Exception as exc:  # noqa: BLE001 - facts are informative only
        return {"error": f"{type(exc).__name__}: {exc}"}


def run_case(spec: dict[str, Any]) -> dict[str, Any]:
    """Start the engine, run the target alone and among the others, compare (in-process)."""
    from vllm import LLM, SamplingParams

    result: dict[str, Any] = {"refused": None}
    started = time.monotonic()
    try:
        llm = LLM(**engine_kwargs(spec))
    except Exception as exc:  # noqa: BLE001 - a refusal is a result
        result["refused"] = f"{type(exc).__name__}: {exc}"
        result["seconds"] = {"start": round(time.monotonic() - started, 1)}
        return result
    start_s = time.monotonic() - started
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=0, ignore_eos=True)
    target, batch = prompts()

    def completion(output: Any) -> Completion:
        sample = output.outputs[0]
        chosen = [
            step[t].logprob for t, step in zip(sample.token_ids, sample.logprobs, strict=True)
        ]
        return Completion(list(sample.token_ids), chosen)

    t0 = time.monotonic()
    alone = completion(llm.generate([target], params, use_tqdm=False)[0])
    t1 = time.monotonic()
    batched_outputs = llm.generate(batch, params, use_tqdm=False)
    t2 = time.monotonic()
    batched = completion(batched_outputs[TARGET_INDEX])
    result.update(compare(alone, batched))
    result.update(
        distinct_tokens_alone=len(set(alone.token_ids)),
        tokens_alone=alone.token_ids,
        tokens_batched=batched.token_ids,
        logprob_bits_alone=float_bits(alone.logprobs),
        logprob_bits_batched=float_bits(batched.logprobs),
        engine=engine_facts(llm),
        seconds={
            "start": round(start_s, 1),
            "alone": round(t1 - t0, 2),
            "batched": round(t2 - t1, 2),
        },
    )
    return result


# --- the orchestrating process ----------------------------------------------------------------


def cases_for(models: list[str], arms: list[int], settings: list[str], tp: int) -> list[Case]:
    return [
        Case(model, arm, setting, tp)
        for model in models
        for arm in arms
        for setting in ARMS[arm].settings
        if setting in settings
    ]


def case_record(case: Case, result: dict[str, Any], log: str, seconds: float) -> dict[str, Any]:
    arm = ARMS[case.arm]
    setting = SETTINGS[case.setting]
    refused = result.get("refused")
    if refused is not None:
        refused = root_cause(log) or refused
    record = {
        "model": case.model,
        "arm": case.arm,
        "arm_meaning": arm.meaning,
        "plugin": bool(arm.plugins),
        "plugins": list(arm.plugins),
        "batch_invariant": arm.batch_invariant,
        "setting": case.setting,
        "cuda_graphs": setting.cuda_graphs,
        "prefix_caching": setting.prefix_caching,
        "tensor_parallel_size": case.tensor_parallel_size,
        "refused": refused,
        "tokens_identical": result.get("tokens_identical"),
        "logprobs_identical": result.get("logprobs_identical"),
        "first_divergence": result.get("first_divergence"),
        "expected": arm.expected,
        **{k: v for k, v in result.items() if k not in ("refused",)},
        "plugin_log": plugin_lines(log)[:8],
        "wall_seconds": round(seconds, 1),
    }
    if result.get("error") is not None:
        record["refused"] = None
    record["meets_expectation"] = (
        None if result.get("error") is not None else expectation_met(arm, record)
    )
    return record


def run_in_subprocess(
    case: Case, args: argparse.Namespace, model_dir: Path, site: Path, timeout: float
) -> dict[str, Any]:
    spec = {
        **dataclasses.asdict(case),
        "model_dir": str(model_dir),
        "attention_backend": args.attention_backend,
        "prefill_backend": args.prefill_backend,
        "kv_cache_gib": args.kv_cache_gib,
        "gpu_memory_utilization": args.gpu_memory_utilization,
    }
    arm = ARMS[case.arm]
    env = engine_env(os.environ, list(arm.plugins), site)
    env["VLLM_BATCH_INVARIANT"] = "1" if arm.batch_invariant else "0"
    env.setdefault("PYTHONUNBUFFERED", "1")
    if args.cpu_thread_binding:
        env[CPU_BINDING_ENV] = args.cpu_thread_binding
    with tempfile.TemporaryDirectory(prefix="gdn_e2e_case_") as tmp:
        result_path = Path(tmp) / "result.json"
        command = [
            sys.executable,
            "-m",
            "gdn_evidence.e2e.determinism",
            "--run-case",
            json.dumps(spec),
            "--result",
            str(result_path),
        ]
        started = time.monotonic()
        try:
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
            log = proc.stdout + proc.stderr
            if result_path.exists():
                result = json.loads(result_path.read_text())
            else:
                result = {"error": f"case process exited {proc.returncode} without a result"}
        except subprocess.TimeoutExpired as exc:
            log = (
                (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            )
            log += (
                (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
            )
            result = {"error": f"timed out after {timeout:.0f} s"}
        seconds = time.monotonic() - started
    if result.get("error") is not None:
        result["log_tail"] = log[-4000:]
    return case_record(case, result, log, seconds)


def write_json(path: Path, provenance: dict[str, Any], cases: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"provenance": provenance, "cases": cases}, indent=1))
    tmp.replace(path)


def summary_line(record: dict[str, Any]) -> str:
    if record.get("error"):
        verdict = f"ERROR {record['error']}"
    elif record["refused"] is not None:
        verdict = f"refused: {record['refused'][:160]}"
    else:
        verdict = (
            f"tokens {'identical' if record['tokens_identical'] else 'DIFFER'}, logprobs "
            f"{'identical' if record['logprobs_identical'] else 'DIFFER'}"
            + (
                ""
                if record["first_divergence"] is None
                else f" (first divergence at {record['first_divergence']})"
            )
        )
    met = record.get("meets_expectation")
    mark = "" if met is None else (" [as expected]" if met else " [NOT AS EXPECTED]")
    case = f"{record['model']} arm {record['arm']} {record['setting']}"
    tp = record["tensor_parallel_size"]
    return f"{case} tp{tp}: {verdict}{mark} ({record['wall_seconds']} s)"


def merge(out: Path, inputs: list[Path]) -> None:
    """Combine JSON files of this script: later files win for the same case; provenance of each
    input kept under ``provenance.runs``."""
    cases: dict[tuple, dict[str, Any]] = {}
    runs = []
    for path in inputs:
        data = json.loads(path.read_text())
        runs.append({"file": path.name, **data["provenance"]})
        for case in data["cases"]:
            key = (case["model"], case["arm"], case["setting"], case["tensor_parallel_size"])
            cases[key] = case
    merged = sorted(cases.values(), key=lambda c: (c["model"], c["arm"], c["setting"]))
    write_json(out, {"merged_from": [p.name for p in inputs], "runs": runs}, merged)


def parse_list(text: str, kind: type, choices: Any, name: str) -> list:
    values = []
    for item in text.split(","):
        item = item.strip()
        try:
            value = kind(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name}: {item!r} is not a valid value") from None
        if value not in choices:
            valid = ", ".join(str(c) for c in choices)
            raise argparse.ArgumentTypeError(f"--{name}: {item!r} is not one of {valid}")
        values.append(value)
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="e2e_determinism.py",
        description="A target prompt alone vs among 31 others in a real vLLM engine, per arm; "
        "tokens and logprobs compared bitwise. JSON with provenance, rewritten after every case.",
    )
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument(
        "--models",
        default="qwen3_next,qwen3_5",
        type=lambda t: parse_list(t, str, MODELS, "models"),
    )
    parser.add_argument(
        "--arms", default="1,2,3,4,5", type=lambda t: parse_list(t, int, ARMS, "arms")
    )
    parser.add_argument(
        "--settings",
        default="eager,default",
        type=lambda t: parse_list(t, str, SETTINGS, "settings"),
        help="engine settings: eager (enforce_eager, no prefix caching), default (torch.compile "
        "and CUDA graphs, prefix caching on)",
    )
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    add_engine_arguments(parser, gpu_memory_utilization=GPU_MEMORY_UTILIZATION)
    parser.add_argument("--seed", type=int, default=0, help="seed of the models' weights")
    parser.add_argument("--case-timeout", type=float, default=540.0, help="seconds per case")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the model folders go (default: temp)"
    )
    parser.add_argument(
        "--merge", type=Path, nargs="+", default=None, help="combine these JSON files into --out"
    )
    parser.add_argument("--run-case", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.run_case is not None:
        spec = json.loads(args.run_case)
        try:
            result = run_case(spec)
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
            result = {"error": f"{type(exc).__name__}: {exc}"}
        args.result.write_text(json.dumps(result))
        return 0
    if args.out is None:
        parser.error("--out is required")
    try:
        args.cpu_thread_binding = check_tensor_parallel(
            args.tensor_parallel_size,
            lambda size: [p for m in args.models for p in tensor_parallel_problems(m, size)],
        )
    except ValueError as exc:
        parser.error(str(exc))
    if not args.out.parent.is_dir():
        parser.error(f"--out: folder {args.out.parent} does not exist")
    if args.merge:
        missing = [str(p) for p in args.merge if not p.is_file()]
        if missing:
            parser.error(f"--merge: no such file: {', '.join(missing)}")
        merge(args.out, args.merge)
        print(f"merged {len(args.merge)} files into {args.out}")
        return 0
    from gdn_evidence.harness.provenance import provenance

    cases = cases_for(args.models, args.arms, args.settings, args.tensor_parallel_size)
    if not cases:
        parser.error("no case: the arms selected run in none of the settings selected")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gdn_e2e_"))
    site = plugin_site(workdir / "plugin-site")
    model_dirs = {
        m: write_weighted_model(workdir / m, m, seed=args.seed) for m in dict.fromkeys(args.models)
    }
    info = provenance(
        script="scripts/e2e_determinism.py",
        new_tokens=NEW_TOKENS,
        target_words=TARGET_WORDS,
        other_words=list(OTHER_WORDS),
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        weights_seed=args.seed,
        tensor_parallel_size=args.tensor_parallel_size,
        visible_gpus=visible_gpus(),
        cpu_thread_binding=args.cpu_thread_binding,
        attention_backend=args.attention_backend or None,
        prefill_backend=args.prefill_backend or None,
        kv_cache_gib=args.kv_cache_gib or None,
        arms={n: dataclasses.asdict(a) for n, a in ARMS.items()},
        vllm_cache_root=os.environ.get("VLLM_CACHE_ROOT"),
    )
    records: list[dict[str, Any]] = []
    write_json(args.out, info, records)
    for case in cases:
        record = run_in_subprocess(case, args, model_dirs[case.model], site, args.case_timeout)
        records.append(record)
        write_json(args.out, info, records)
        print(summary_line(record), flush=True)
    met = [r["meets_expectation"] for r in records if r["meets_expectation"] is not None]
    errors = [r for r in records if r.get("error")]
    print(f"{len(records)} cases; {sum(met)} of {len(met)} as expected; {len(errors)} errors")
    return 0 if all(met) and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
