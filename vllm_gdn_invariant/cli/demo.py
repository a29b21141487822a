"""``python -m vllm_gdn_invariant demo``: one request alone and among others, with the plugin.

It writes a tiny Qwen3-Next model with seeded random weights (``models/weighted.py``: greedy
tokens depend on the context, which dummy weights' near-constant logits do not) to a temporary
folder, starts vLLM offline with ``VLLM_PLUGINS=gdn_invariant``, runs a target request alone
and then among requests of mixed lengths under a small token budget (so that prompts are split
and steps mix prefills and decodes), and reports whether the target's tokens and logprobs are
bitwise identical; the exit status is 1 when they are not. On a CUDA GPU the engine runs with
``VLLM_BATCH_INVARIANT=1`` (the plugin's batch-invariant mode); on CPU without it, and the
report says what the CPU run can and cannot show. With ``VLLM_GDN_INVARIANT_SHADOW`` set, the
report also sums the shadow checker's records of the run (``"shadow": {"checks": N, ...}``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_gdn_invariant import cli
from vllm_gdn_invariant.cli.report import totals
from vllm_gdn_invariant.models.tiny import DEMO_OTHER_WORDS, DEMO_TARGET_WORDS, words
from vllm_gdn_invariant.models.weighted import write_weighted_model
from vllm_gdn_invariant.plugin.entry import plan, registered_status
from vllm_gdn_invariant.shadow.config import ShadowConfig
from vllm_gdn_invariant.shadow.record import read_records

PLUGIN_NAME = "gdn_invariant"
TOKEN_BUDGET = 64
CPU_CAVEAT = (
    "vLLM's CPU build runs GDN layers through forward_cpu, one sequence at a time (the routed "
    "_forward_core and the GPU kernels do not run), and has no batch-invariant MoE backend "
    "(VLLM_BATCH_INVARIANT=1 is refused for Qwen3-Next here). IDENTICAL on CPU shows that the "
    "plugin loads and serves; it says nothing about a GPU run, which is where the plugin's "
    "routing and batch-invariant mode act."
)


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]

    @classmethod
    def from_request_output(cls, output: Any) -> Completion:
        sample = output.outputs[0]
        chosen = [
            step[tok].logprob for tok, step in zip(sample.token_ids, sample.logprobs, strict=True)
        ]
        return cls(list(sample.token_ids), chosen)


def float_bits(values: list[float]) -> list[int]:
    return [struct.unpack("<Q", struct.pack("<d", v))[0] for v in values]


@dataclass
class DemoReport:
    plugin: str
    device: str
    batch_invariant: bool
    compared: str
    caveat: str | None
    tokens_identical: bool
    logprobs_identical: bool
    first_token_divergence: int | None
    max_logprob_diff: float
    alone: Completion
    batched: Completion
    shadow: dict[str, Any] = field(default_factory=lambda: {"enabled": False})
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return "IDENTICAL" if self.tokens_identical and self.logprobs_identical else "DIFFERENT"

    def lines(self) -> list[str]:
        out = [
            f"plugin:   {self.plugin}",
            f"device:   {self.device}",
            f"VLLM_BATCH_INVARIANT: {int(self.batch_invariant)}",
            f"compared: {self.compared}",
            f"target alone vs batched: {self.verdict}",
            f"  tokens identical:   {self.tokens_identical}"
            + (
                ""
                if self.first_token_divergence is None
                else f" (first divergence at {self.first_token_divergence})"
            ),
            f"  logprobs identical: {self.logprobs_identical} (bitwise; max |diff| "
            f"{self.max_logprob_diff:.3g})",
            f"shadow:   {shadow_line(self.shadow)}",
        ]
        if self.caveat:
            out.append(f"CPU run:  {self.caveat}")
        return out


def shadow_line(shadow: dict[str, Any]) -> str:
    """The shadow summary in words."""
    if not shadow.get("enabled"):
        return "off (VLLM_GDN_INVARIANT_SHADOW=<rate> turns it on)"
    parts = [
        f"{ref}: {n['checks']} checks, {n['with_difference']} with a difference"
        for ref, n in sorted(shadow["by_reference"].items())
    ]
    return (
        f"{shadow['checks']} checks, {shadow['with_difference']} with a difference, "
        f"{shadow['failures']} failures ({'; '.join(parts) or 'no check ran'})"
    )


def shadow_summary(config: ShadowConfig, since: float) -> dict[str, Any]:
    """Totals of the shadow records written since ``since`` (time.time()) by any process."""
    if not config.enabled:
        return {"enabled": False}
    files = config.files()
    records = [r for path in files for r in read_records(path) if r["time"] >= since]
    return {
        "enabled": True,
        "setting": config.describe(),
        **totals(records),
        "files": [str(p) for p in files],
    }


def compare(alone: Completion, batched: Completion) -> tuple[bool, bool, int | None, float]:
    tokens_identical = alone.token_ids == batched.token_ids
    divergence = next(
        (
            i
            for i, (x, y) in enumerate(zip(alone.token_ids, batched.token_ids, strict=False))
            if x != y
        ),
        None,
    )
    if divergence is None and len(alone.token_ids) != len(batched.token_ids):
        divergence = min(len(alone.token_ids), len(batched.token_ids))
    logprobs_identical = tokens_identical and float_bits(alone.logprobs) == float_bits(
        batched.logprobs
    )
    diffs = [abs(x - y) for x, y in zip(alone.logprobs, batched.logprobs, strict=False)]
    finite = [d for d in diffs if math.isfinite(d)]
    return tokens_identical, logprobs_identical, divergence, max(finite, default=0.0)


class DemoSetupError(ValueError):
    """The demo cannot run as asked (the message says why)."""


def has_cuda() -> bool:
    """A CUDA GPU is visible (ROCm builds of torch report ``is_available()`` too: not CUDA)."""
    import torch

    return torch.cuda.is_available() and torch.version.hip is None


def choose_batch_invariant(flag: bool | None, environ: dict[str, str], cuda: bool) -> bool:
    """``--batch-invariant``/``--no-batch-invariant`` if given, else an exported
    ``VLLM_BATCH_INVARIANT`` (an integer, as vLLM reads it), else on with CUDA only."""
    if flag is not None:
        return flag
    exported = environ.get("VLLM_BATCH_INVARIANT")
    if exported is not None and exported.strip():
        try:
            return int(exported) != 0
        except ValueError:
            raise DemoSetupError(
                f"VLLM_BATCH_INVARIANT={exported!r} is not an integer (vLLM reads 0 or 1)"
            ) from None
    return cuda


def what_is_compared(batch_invariant: bool, max_tokens: int, model: str, mode: str) -> str:
    """One sentence: the comparison the demo makes (``mode``: the plugin's mode)."""
    others = ", ".join(map(str, DEMO_OTHER_WORDS))
    mode = f"plugin (mode {mode})" + (" + VLLM_BATCH_INVARIANT=1" if batch_invariant else "")
    return (
        f"{model}; a {DEMO_TARGET_WORDS}-word prompt, {max_tokens} greedy tokens with "
        f"logprobs, alone vs among {len(DEMO_OTHER_WORDS)} others of {others} words under a "
        f"{TOKEN_BUDGET}-token budget (prompts split, steps mixing prefills and decodes); "
        f"{mode}; tokens and logprobs compared bit for bit"
    )


def enable_plugin_env() -> None:
    """Make vLLM load this plugin in every process it starts."""
    current = os.environ.get("VLLM_PLUGINS")
    names = [n for n in (current or "").split(",") if n]
    if PLUGIN_NAME not in names:
        names.append(PLUGIN_NAME)
    os.environ["VLLM_PLUGINS"] = ",".join(names)


def progress(step: int, total: int, text: str) -> None:
    print(f"[demo {step}/{total}] {text}", flush=True)


def run_demo(
    model_dir: str | None,
    max_tokens: int,
    seed: int,
    batch_invariant: bool,
    attention_backend: str | None = None,
) -> DemoReport:
    total = 5
    timings: dict[str, float] = {}
    started = time.time()
    os.environ["VLLM_BATCH_INVARIANT"] = "1" if batch_invariant else "0"
    progress(1, total, "plugin: " + plan().summary())
    enable_plugin_env()

    t0 = time.monotonic()
    if model_dir is None:
        model_dir = tempfile.mkdtemp(prefix="gdn_invariant_demo_")
        write_weighted_model(model_dir, "qwen3_next", seed=seed)
        model = "tiny Qwen3-Next, seeded random weights"
        progress(2, total, f"wrote a tiny Qwen3-Next model (seeded weights) to {model_dir}")
    else:
        model = f"the model in {model_dir}"
        progress(2, total, f"using {model} (its own weights)")

    from vllm import LLM, SamplingParams

    progress(
        3,
        total,
        f"starting vLLM offline (enforce_eager, VLLM_BATCH_INVARIANT={int(batch_invariant)})",
    )
    llm = LLM(
        model=model_dir,
        seed=seed,
        enforce_eager=True,
        gpu_memory_utilization=0.2,
        max_model_len=1024,
        max_num_seqs=8,
        max_num_batched_tokens=TOKEN_BUDGET,
        enable_prefix_caching=False,
        **({"attention_backend": attention_backend} if attention_backend else {}),
    )
    timings["start"] = time.monotonic() - t0
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, logprobs=1, ignore_eos=True, seed=seed
    )
    target = words(DEMO_TARGET_WORDS, start=7)

    t1 = time.monotonic()
    progress(4, total, f"target alone ({DEMO_TARGET_WORDS}-word prompt, {max_tokens} tokens)")
    alone = Completion.from_request_output(llm.generate([target], params, use_tqdm=False)[0])
    timings["alone"] = time.monotonic() - t1

    t2 = time.monotonic()
    others = [words(n, start=31 * (i + 1)) for i, n in enumerate(DEMO_OTHER_WORDS)]
    progress(
        5,
        total,
        f"target among {len(others)} others of {', '.join(map(str, DEMO_OTHER_WORDS))} "
        f"words ({TOKEN_BUDGET}-token budget: steps mix prefills and decodes)",
    )
    outputs = llm.generate([others[0], target, *others[1:]], params, use_tqdm=False)
    batched = Completion.from_request_output(outputs[1])
    timings["batched"] = time.monotonic() - t2

    tokens_identical, logprobs_identical, divergence, max_diff = compare(alone, batched)
    from vllm.platforms import current_platform

    status = registered_status() or plan()
    return DemoReport(
        plugin=status.summary(),
        device=str(current_platform.device_name),
        batch_invariant=batch_invariant,
        compared=what_is_compared(batch_invariant, max_tokens, model, status.config.mode.value),
        caveat=CPU_CAVEAT if current_platform.is_cpu() else None,
        tokens_identical=tokens_identical,
        logprobs_identical=logprobs_identical,
        first_token_divergence=divergence,
        max_logprob_diff=max_diff,
        alone=alone,
        batched=batched,
        shadow=shadow_summary(status.config.shadow, started),
        seconds={k: round(v, 1) for k, v in timings.items()},
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo with the parsed ``demo`` arguments; print (and write) the report. 0 when the
    verdict is IDENTICAL, 1 when it is DIFFERENT or vLLM does not start, 2 on a bad setting."""
    try:
        batch_invariant = choose_batch_invariant(args.batch_invariant, dict(os.environ), has_cuda())
    except DemoSetupError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2
    try:
        report = run_demo(
            args.model, args.max_tokens, args.seed, batch_invariant, args.attention_backend
        )
    except Exception as exc:  # noqa: BLE001 - vLLM's refusal is the demo's answer
        print(f"demo: vLLM did not start or serve: {cli.describe_error(exc)}", file=sys.stderr)
        return 1
    print("\n".join(["", "== gdn_invariant demo report ==", *report.lines()]), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({**asdict(report), "verdict": report.verdict}, fh, indent=1)
    return 0 if report.verdict == "IDENTICAL" else 1


def main(argv: list[str] | None = None) -> int:
    """``demo`` with its own arguments, as ``vllm-gdn-invariant demo ARGS``."""
    return cli.main(["demo", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
