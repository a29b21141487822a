"""``python -m vllm_gdn_invariant demo``: one request alone and among others, with the plugin.

It writes a tiny Qwen3-Next model (config, a locally built tokenizer, dummy weights) to a
temporary folder, starts vLLM offline with ``VLLM_PLUGINS=gdn_invariant``, runs a target
request alone and then among requests of mixed lengths under a small token budget (so that
steps mix prefills and decodes), and reports whether the target's tokens and logprobs are
bitwise identical. With ``VLLM_GDN_INVARIANT_SHADOW`` set, the report also sums the shadow
checker's records of the run (``"shadow": {"checks": N, "with_difference": M, ...}``).
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
from vllm_gdn_invariant.models.tiny import words, write_tiny_model
from vllm_gdn_invariant.plugin.entry import plan, registered_status
from vllm_gdn_invariant.shadow.config import ShadowConfig
from vllm_gdn_invariant.shadow.record import read_records

PLUGIN_NAME = "gdn_invariant"
TARGET_PROMPT_WORDS = 12
OTHER_PROMPT_WORDS = (300, 37, 64, 5, 150, 1)


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
    tokens_identical: bool
    logprobs_identical: bool
    first_token_divergence: int | None
    max_logprob_diff: float
    alone: Completion
    batched: Completion
    shadow: dict[str, Any] = field(default_factory=lambda: {"enabled": False})
    seconds: dict[str, float] = field(default_factory=dict)

    def lines(self) -> list[str]:
        verdict = "IDENTICAL" if self.tokens_identical and self.logprobs_identical else "DIFFERENT"
        out = [
            f"plugin:   {self.plugin}",
            f"device:   {self.device}",
            f"target alone vs batched: {verdict}",
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


def enable_plugin_env() -> None:
    """Make vLLM load this plugin in every process it starts."""
    current = os.environ.get("VLLM_PLUGINS")
    names = [n for n in (current or "").split(",") if n]
    if PLUGIN_NAME not in names:
        names.append(PLUGIN_NAME)
    os.environ["VLLM_PLUGINS"] = ",".join(names)


def progress(step: int, total: int, text: str) -> None:
    print(f"[demo {step}/{total}] {text}", flush=True)


def run_demo(model_dir: str | None, max_tokens: int, seed: int) -> DemoReport:
    total = 5
    timings: dict[str, float] = {}
    started = time.time()
    progress(1, total, "plugin: " + plan().summary())
    enable_plugin_env()

    t0 = time.monotonic()
    if model_dir is None:
        model_dir = tempfile.mkdtemp(prefix="gdn_invariant_demo_")
        write_tiny_model(model_dir)
        progress(2, total, f"wrote a tiny Qwen3-Next model to {model_dir}")
    else:
        progress(2, total, f"using the model in {model_dir}")

    from vllm import LLM, SamplingParams

    progress(3, total, "starting vLLM offline (dummy weights, enforce_eager)")
    llm = LLM(
        model=model_dir,
        load_format="dummy",
        seed=seed,
        enforce_eager=True,
        gpu_memory_utilization=0.2,
        max_model_len=1024,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
    )
    timings["start"] = time.monotonic() - t0
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, logprobs=1, ignore_eos=True, seed=seed
    )
    target = words(TARGET_PROMPT_WORDS, start=7)

    t1 = time.monotonic()
    progress(4, total, f"target alone ({TARGET_PROMPT_WORDS}-word prompt, {max_tokens} tokens)")
    alone = Completion.from_request_output(llm.generate([target], params, use_tqdm=False)[0])
    timings["alone"] = time.monotonic() - t1

    t2 = time.monotonic()
    others = [words(n, start=31 * (i + 1)) for i, n in enumerate(OTHER_PROMPT_WORDS)]
    progress(
        5,
        total,
        f"target among {len(others)} others of {', '.join(map(str, OTHER_PROMPT_WORDS))} "
        "words (64-token budget: steps mix prefills and decodes)",
    )
    outputs = llm.generate([others[0], target, *others[1:]], params, use_tqdm=False)
    batched = Completion.from_request_output(outputs[1])
    timings["batched"] = time.monotonic() - t2

    tokens_identical, logprobs_identical, divergence, max_diff = compare(alone, batched)
    from vllm.platforms import current_platform

    status = registered_status() or plan()
    device = str(current_platform.device_name)
    if current_platform.is_cpu():
        device += " (vLLM runs GDN layers through forward_cpu here; the routing is not exercised)"
    return DemoReport(
        plugin=status.summary(),
        device=device,
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
    """Run the demo with the parsed ``demo`` arguments; print (and write) the report."""
    report = run_demo(args.model, args.max_tokens, args.seed)
    print("\n".join(["", "== gdn_invariant demo report ==", *report.lines()]), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(asdict(report), fh, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``demo`` with its own arguments, as ``vllm-gdn-invariant demo ARGS``."""
    return cli.main(["demo", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
