"""The shadow checker in vLLM's engine, per plugin mode, as JSON with provenance.

    python scripts/shadow_engine_check.py --out shadow_engine.json [--model DIR] [--arms ...]

For each arm it runs vLLM's ``LLM`` (in a child process) with the plugin and
``VLLM_GDN_INVARIANT_SHADOW=1.0,ref=golden+decode``: arm ``route`` (``VLLM_GDN_INVARIANT_MODE=
route``: mixed steps' decode rows routed), arm ``off`` (mode off: only the shadow hooks,
vLLM's own mixed path) and arm ``golden`` (mode golden: every decode row served by the golden
kernels, or on CPU by the goldens, and recomputed by the goldens from the same inputs);
``--state-dtype`` sets the recurrent state's dtype (vLLM's ``mamba_ssm_cache_dtype``). The
workload is the demo's: requests of 1 to 300 words under a 64-token budget, so steps mix
decode rows and prefill chunks. On CUDA the engine runs with
``cudagraph_mode=PIECEWISE`` (a FULL-graph replay runs no Python: the hooks would see mixed
steps only); on CPU eager.

The report gives, per arm, reference, provider and step kind: checks, checks with a
difference by field and the max ULP distance by field. Expected: reference ``decode`` 0 for
providers ``vllm-packed-decode`` and ``routed`` and > 0 (fp32 state) for ``vllm-mixed``;
reference ``golden`` the provider-agreement distance in arms ``route`` and ``off``, and 0 in
every field for every check of arm ``golden``. Model: ``--model`` (dummy weights), by
default the engine benchmarks' Qwen3-Next of 8 layers with Qwen3-Next's GDN head counts
(``BENCH_QWEN3_NEXT``) on CUDA and the tiny Qwen3-Next on CPU. The plugin loads through the
entry point of ``e2e/plugin_site.py`` (the project need not be installed); attention and GDN
prefill backends and the KV cache as in the other engine scripts (``e2e/engine_options.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path

from gdn_evidence.e2e.engine_options import (
    add_engine_arguments,
    engine_options,
)
from gdn_evidence.e2e.plugin_site import PLUGIN, engine_env, plugin_site
from gdn_evidence.harness.provenance import provenance
from gdn_evidence.harness.shadow_records import group_checks
from vllm_gdn_invariant.models.tiny import (
    BENCH_QWEN3_NEXT,
    DEMO_OTHER_WORDS,
    DEMO_TARGET_WORDS,
    words,
    write_tiny_model,
)
from vllm_gdn_invariant.shadow.record import FIELDS, read_records

SCHEMA = "vllm-gdn-invariant/shadow-engine-check/1"
ARMS = ("route", "off", "golden")


def child(arm: str, folder: Path, args: argparse.Namespace) -> None:
    """One arm: vLLM's LLM with the plugin and shadow on; records go to ``folder``."""
    import torch
    from vllm import LLM, SamplingParams

    cuda = torch.cuda.is_available()
    model = args.model
    if model is None:
        overrides = BENCH_QWEN3_NEXT if cuda else {}
        model = str(write_tiny_model(folder / "model", **overrides))
    options = (
        {"compilation_config": {"cudagraph_mode": "PIECEWISE"}} if cuda else {"enforce_eager": True}
    )
    llm = LLM(
        model=model,
        load_format="dummy",
        seed=0,
        max_model_len=1024,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
        mamba_ssm_cache_dtype=args.state_dtype,
        **options,
        **engine_options(
            args.attention_backend,
            args.prefill_backend,
            args.gpu_memory_utilization,
            args.kv_cache_gib,
        ),
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    target = words(DEMO_TARGET_WORDS, start=7)
    others = [words(n, start=31 * (i + 1)) for i, n in enumerate(DEMO_OTHER_WORDS)]
    llm.generate([target], params, use_tqdm=False)
    llm.generate([others[0], target, *others[1:]], params, use_tqdm=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--model", help="a model folder (dummy weights)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--arms",
        default=",".join(ARMS),
        type=lambda text: [a.strip() for a in text.split(",")],
        help=f"comma-separated, of {', '.join(ARMS)} (default: all)",
    )
    parser.add_argument(
        "--state-dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="vLLM's mamba_ssm_cache_dtype, the recurrent state's dtype (auto: the model's)",
    )
    add_engine_arguments(parser, gpu_memory_utilization=0.2)
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.folder, args)
        return 0
    if args.out is None:
        parser.error("--out is required")
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown or not args.arms:
        parser.error(f"--arms: {', '.join(unknown) or 'none given'}; valid: {', '.join(ARMS)}")
    root = Path(tempfile.mkdtemp(prefix="shadow_engine_"))
    site = plugin_site(root / "plugin-site")
    engine = {
        "attention_backend": args.attention_backend or None,
        "prefill_backend": args.prefill_backend or None,
        "kv_cache_gib": args.kv_cache_gib or None,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "mamba_ssm_cache_dtype": args.state_dtype,
    }
    report = {"schema": SCHEMA, "provenance": provenance(engine=engine), "arms": {}}
    for arm in args.arms:
        folder = root / arm
        folder.mkdir()
        env = engine_env(os.environ, [PLUGIN], site)
        env.update(
            VLLM_GDN_INVARIANT_MODE=arm,
            VLLM_GDN_INVARIANT_SHADOW=f"1.0,ref=golden+decode,out={folder}/shadow.jsonl",
        )
        command = [sys.executable, __file__, "--child", arm, "--folder", str(folder)]
        command += ["--max-tokens", str(args.max_tokens), "--state-dtype", args.state_dtype]
        command += ["--attention-backend", args.attention_backend]
        command += ["--prefill-backend", args.prefill_backend]
        command += ["--kv-cache-gib", str(args.kv_cache_gib)]
        command += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
        if args.model:
            command += ["--model", args.model]
        proc = subprocess.run(command, env=env, capture_output=True, text=True)
        (root / f"{arm}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            print(proc.stdout[-3000:] + proc.stderr[-5000:], file=sys.stderr)
            return 1
        records = [r for p in sorted(folder.glob("shadow.*.jsonl")) for r in read_records(p)]
        failures = [r for r in records if r["kind"] == "failure"]
        report["arms"][arm] = {"groups": group_checks(records), "failures": failures}
        for g in report["arms"][arm]["groups"]:
            print(
                f"{arm:<6} {g['reference']:<7} {g['provider']:<19} {g['step_kind']:<7} "
                f"{g['state_dtype']:<9} checks {g['checks']:>4} ({g['layers']} layers)  with diff "
                + "/".join(str(g["checks_with_difference"][f]) for f in FIELDS)
                + "  max ULP "
                + "/".join(str(g["max_ulp"][f]) for f in FIELDS),
                flush=True,
            )
        print(f"{arm:<6} failures: {len(failures)}", flush=True)
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
