"""Decode rows alone vs. in mixed steps through vLLM's real _forward_core (GPU evidence).

Usage, on the GPU machine (vLLM's Python code importable):
    python scripts/mixed_step_invariance.py --out FILE.json                 # with the plugin
    python scripts/mixed_step_invariance.py --out FILE.json \\
        --patched-file build/patched/vllm-0.30.0/qwen_gdn_linear_attn.py    # with vllm-diffs/
    python scripts/mixed_step_invariance.py --out FILE.json --heads tp4 --state-dtypes float32
    python scripts/mixed_step_invariance.py --out FILE.json --mode golden    # golden kernels
    python scripts/mixed_step_invariance.py --merge A.json B.json --out docs/evidence/...
    python scripts/mixed_step_invariance.py --summary docs/evidence/mixed_step_invariance.json

For every case (Qwen3-Next and TP4 per-rank head counts, fp32 and bf16 state, both
``gqa_interleaved_layout`` values, the compositions of harness/mixed_step.py) it writes two
rows, ``plugin: true`` (the routed method) and ``plugin: false`` (vLLM's own), with integer
counts of differing elements; see gdn_evidence/harness/mixed_step.py. With ``--mode
golden`` the plugin's rows are mode golden's (every decode row served by the golden kernels),
so the counts say whether those rows are invariant across the compositions as well.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time

import checkout  # noqa: F401 - this checkout first on sys.path
import torch

from gdn_evidence.harness.layer import LAYOUTS, STATE_DTYPES, make_vllm_config
from gdn_evidence.harness.mixed_step import COMPOSITIONS, all_cases, run_case
from gdn_evidence.harness.provenance import provenance
from vllm_gdn_invariant.patches.routing import QWEN_GDN_MODULE

IMPL_LABELS = {
    "plugin": "plugin",
    "plugin-golden": "plugin, mode golden",
    "patched-source": "vllm-diffs/",
}
IMPL_ORDER = tuple(IMPL_LABELS)
COUNTS = ("out_differ", "state_differ", "conv_differ", "following_out_differ")


def load_patched_module(path: str) -> None:
    """Import the patched file in place of vLLM's qwen_gdn_linear_attn."""
    parent_name, _, leaf = QWEN_GDN_MODULE.rpartition(".")
    parent = importlib.import_module(parent_name)
    assert QWEN_GDN_MODULE not in sys.modules, "vLLM's module was imported before the patch"
    spec = importlib.util.spec_from_file_location(QWEN_GDN_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[QWEN_GDN_MODULE] = module
    spec.loader.exec_module(module)
    setattr(parent, leaf, module)


def install(args) -> str:
    if args.patched_file:
        load_patched_module(args.patched_file)
        return "patched-source"
    from vllm_gdn_invariant.plugin import entry  # only here: a patched-source run loads no plugin

    os.environ["VLLM_GDN_INVARIANT_STRICT"] = "1"
    os.environ["VLLM_GDN_INVARIANT_MODE"] = args.mode
    entry.register()
    assert entry.registered_status().applied
    return "plugin" if args.mode == "route" else f"plugin-{args.mode}"


def write(path, impl, start, failures, cases, complete=False) -> None:
    """Write what is measured so far (a run cut short still leaves its cases)."""
    meta = provenance(
        impl=impl, seconds=round(time.time() - start, 1), failures=failures, complete=complete
    )
    with open(path, "w") as fh:
        json.dump({"provenance": meta, "cases": cases}, fh, indent=1)


def merge(paths: list[str], out: str) -> None:
    """One file of several runs' cases; an input may itself be a merged file."""
    runs, cases = [], []
    for path in paths:
        data = json.load(open(path))
        runs.extend(data["provenance"].get("runs", [data["provenance"]]))
        cases.extend(data["cases"])
    json.dump({"provenance": {"runs": runs}, "cases": cases}, open(out, "w"), indent=1)


def total(rows: list[dict], key: str) -> str:
    return f"{sum(r[key] for r in rows):,}"


def table_order(key: tuple) -> tuple:
    """vLLM version, plugin before vllm-diffs/, Triton before FlashInfer, Qwen3-Next heads before
    TP4, fp32 before bf16."""
    version, impl, backend, _, h, _, dtype = key
    return version, IMPL_ORDER.index(impl), backend != "triton", -h, dtype != "float32"


def summary(path: str) -> str:
    """The docs/routing.md table: one row per (vLLM, how installed, prefill backend, mamba
    cache mode, heads, state dtype)."""
    data = json.load(open(path))
    groups: dict[tuple, dict[bool, list[dict]]] = {}
    for c in data["cases"]:
        key = (
            c["vllm"],
            c["impl"],
            c.get("prefill_backend", "triton"),
            c.get("mamba_cache_mode", "none"),
            c["H"],
            c["HV"],
            c["state_dtype"],
        )
        groups.setdefault(key, {True: [], False: []})[c["plugin"]].append(c)
    lines = []
    for key in sorted(groups, key=table_order):
        version, impl, backend, mode, h, hv, dtype = key
        routed, upstream = groups[key][True], groups[key][False]
        own = [total(upstream, k) for k in ("out_differ", "state_differ", "following_out_differ")]
        with_diff = sum(
            any(r[k] for k in ("out_differ", "state_differ", "conv_differ")) for r in upstream
        )
        prefill = [f"prefill_{k}_differ_vs_unpatched" for k in ("out", "state", "conv")]
        checkpoints = "-"
        if any("checkpoints" in r for r in routed):
            checkpoints = (
                f"{total(routed, 'checkpoints')} / "
                f"{total(routed, 'prefill_checkpoint_differ_vs_unpatched')}"
            )
        lines.append(
            f"| {version} | {IMPL_LABELS[impl]} | {backend} | {mode} | "
            f"{h}/{hv} | {dtype.replace('float32', 'fp32').replace('bfloat16', 'bf16')} | "
            f"{len(routed)} | "
            + " / ".join(total(routed, k) for k in COUNTS)
            + " | "
            + " / ".join(total(routed, k) for k in prefill)
            + f" | {checkpoints} | {' / '.join(own)} ({with_diff}) |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out")
    parser.add_argument(
        "--summary", metavar="FILE", nargs="+", help="print the docs table of FILE(s)"
    )
    parser.add_argument("--patched-file")
    parser.add_argument(
        "--mode",
        choices=("route", "golden"),
        default="route",
        help="the plugin's VLLM_GDN_INVARIANT_MODE (not with --patched-file)",
    )
    parser.add_argument(
        "--heads", nargs="+", choices=sorted(LAYOUTS), default=sorted(LAYOUTS), help="head layouts"
    )
    parser.add_argument(
        "--state-dtypes", nargs="+", choices=sorted(STATE_DTYPES), default=list(STATE_DTYPES)
    )
    parser.add_argument("--merge", nargs="+")
    parser.add_argument(
        "--prefill-backend",
        choices=("triton", "flashinfer"),
        default="triton",
        help="vLLM's gdn_prefill_backend",
    )
    parser.add_argument(
        "--align-block-size",
        type=int,
        metavar="N",
        help="prefix caching on: mamba_cache_mode=align with N-token blocks",
    )
    parser.add_argument(
        "--compositions", type=int, metavar="K", help="only the first K compositions"
    )
    args = parser.parse_args()
    if args.summary:
        print("\n".join(summary(path) for path in args.summary))
        return 0
    if not args.out:
        parser.error("--out is required")
    if args.merge:
        merge(args.merge, args.out)
        return 0
    if args.patched_file and args.mode != "route":
        parser.error("--mode applies to the plugin; --patched-file carries the routing only")
    impl = install(args)
    import vllm

    device = torch.device("cuda")
    dims_list = [LAYOUTS[h] for h in args.heads]
    dtypes = [STATE_DTYPES[d] for d in args.state_dtypes]
    configs = {}
    cases, failures = [], []
    start = time.time()
    compositions = COMPOSITIONS[: args.compositions]
    for dims, state_dtype, layout, comp in all_cases(dims_list, dtypes, compositions=compositions):
        key = (dims, state_dtype)
        if key not in configs:
            configs[key] = make_vllm_config(
                dims,
                state_dtype,
                prefill_backend=args.prefill_backend,
                align_block_size=args.align_block_size,
            )
        try:
            result = run_case(
                configs[key],
                dims,
                state_dtype,
                comp,
                gqa_interleaved_layout=layout,
                device=device,
                prefill_backend=args.prefill_backend,
            )
        except Exception as exc:  # noqa: BLE001 - recorded in the evidence, not hidden
            failures.append(
                {
                    "case": [dims.num_k_heads, str(state_dtype), layout, str(comp)],
                    "error": repr(exc)[:500],
                }
            )
            print("FAILED", dims, state_dtype, layout, comp, repr(exc)[:300], flush=True)
            continue
        for row in (result["routed"], result["upstream"]):
            row.update(vllm=vllm.__version__, impl=impl)
            cases.append(row)
        write(args.out, impl, start, failures, cases)
        r, u = result["routed"], result["upstream"]
        print(
            f"H={dims.num_k_heads} {str(state_dtype)[6:]:8} interleaved={int(layout)} "
            f"{comp.decodes:>2}d {list(comp.prefills)} fresh={int(comp.fresh_prefill)} | "
            f"plugin "
            + " ".join(str(r[c]) for c in COUNTS)
            + f" prefill {r['prefill_out_differ_vs_unpatched']}"
            f"/{r['prefill_state_differ_vs_unpatched']}/{r['prefill_conv_differ_vs_unpatched']}"
            f" ckpt {r['checkpoints']}/{r['prefill_checkpoint_differ_vs_unpatched']}"
            f" | upstream " + " ".join(str(u[c]) for c in COUNTS),
            flush=True,
        )
    write(args.out, impl, start, failures, cases, complete=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
