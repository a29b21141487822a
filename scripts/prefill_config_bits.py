"""Which configs of the autotuned FLA chunk-prefill kernels change the bits, and which are not
repeatable (GPU evidence for the config pin, ``vllm_gdn_invariant/patches/bi_autotune.py``).

For every autotuned kernel and every config of its list (the others held at their list's
first config), vLLM's FLA ``chunk_gated_delta_rule`` runs a varlen batch twice, the caching
allocator's free memory filled with NaN before each run (a kernel that reads memory it did
not write then shows it), and the output and final states are compared bit for bit with each
other and with the all-first-configs run. The pin's own choice is marked.

Usage (GPU machine, vLLM's Python code on PYTHONPATH, e.g. the engine bundle):
    python scripts/prefill_config_bits.py --out $OUT/prefill_config_bits.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path
import torch

from gdn_evidence.harness.chunk_prefill import cu_seqlens, varlen_inputs
from gdn_evidence.harness.provenance import provenance
from vllm_gdn_invariant.patches.bi_autotune import (
    AUTOTUNED_KERNELS,
    FLA_OPS,
    find_autotuner,
    pinned_config,
)
from vllm_gdn_invariant.shadow.bits import same_bits

HEADS, K, V = 32, 128, 128
BATCHES = {"700+17+300": [700, 17, 300], "4096+5": [4096, 5]}


def poison_free_memory() -> None:
    """Fill what the caching allocator holds free with NaN, so that the next allocations
    start from NaN, not from what an earlier run left."""
    free, _ = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    size = max(min(reserved, free // 2), 1 << 20) // 4
    junk = torch.full((size,), float("nan"), device="cuda")
    del junk


def prefill(inputs, lengths):
    from vllm.third_party.flash_linear_attention.ops import chunk_gated_delta_rule

    q, k, v, decay, beta = inputs
    initial = torch.zeros(len(lengths), HEADS, V, K, dtype=torch.float32, device="cuda")
    poison_free_memory()
    out, final = chunk_gated_delta_rule(
        q=q,
        k=k,
        v=v,
        g=decay,
        beta=beta,
        initial_state=initial,
        output_final_state=True,
        cu_seqlens=cu_seqlens(lengths, "cuda"),
        use_qk_l2norm_in_kernel=True,
    )
    torch.cuda.synchronize()
    return out.clone(), final.clone()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    tuners = {}
    for module, name in AUTOTUNED_KERNELS:
        kernel = getattr(importlib.import_module(f"{FLA_OPS}.{module}"), name)
        tuners[f"{module}.{name}"] = find_autotuner(kernel)
    lists = {key: list(t.configs) for key, t in tuners.items()}

    def hold(choice: dict[str, object]) -> None:
        for key, tuner in tuners.items():
            tuner.configs = [choice.get(key, lists[key][0])]
            tuner.cache.clear()

    inputs = {
        name: varlen_inputs(sum(lengths), 11, HEADS, K, V, "cuda")
        for name, lengths in BATCHES.items()
    }
    hold({})
    reference = {name: prefill(inputs[name], BATCHES[name]) for name in BATCHES}
    cases = []
    started = time.monotonic()
    info = provenance(
        script="scripts/prefill_config_bits.py",
        heads=HEADS,
        key_dim=K,
        value_dim=V,
        batches=BATCHES,
    )

    def write() -> None:
        summary = {
            name: {
                "not_repeatable": [
                    f"{c['kernel']}[{c['index']}]"
                    for c in cases
                    if not c.get(name, {}).get("repeatable", True)
                ],
                "other_bits": [
                    f"{c['kernel']}[{c['index']}]"
                    for c in cases
                    if not c.get(name, {}).get("equal_to_first_configs", True)
                ],
                "errors": [f"{c['kernel']}[{c['index']}]" for c in cases if "error" in c],
            }
            for name in BATCHES
        }
        info["seconds"] = round(time.monotonic() - started, 1)
        args.out.write_text(
            json.dumps({"provenance": info, "summary": summary, "cases": cases}, indent=1)
        )

    for key, configs in lists.items():
        pinned = pinned_config(configs)
        for index, config in enumerate(configs):
            hold({key: config})
            record = {
                "kernel": key,
                "config": str(config),
                "index": index,
                "pinned": config is pinned,
            }
            try:
                for name, lengths in BATCHES.items():
                    first = prefill(inputs[name], lengths)
                    second = prefill(inputs[name], lengths)
                    record[name] = {
                        "repeatable": same_bits(first[0], second[0])
                        and same_bits(first[1], second[1]),
                        "equal_to_first_configs": same_bits(first[0], reference[name][0])
                        and same_bits(first[1], reference[name][1]),
                        "nan": bool(first[0].isnan().any() or first[1].isnan().any()),
                    }
            except Exception as exc:  # noqa: BLE001 - a config that cannot run is a result
                record["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            cases.append(record)
            print(json.dumps(record), flush=True)
        write()
    hold({})
    for key, tuner in tuners.items():
        tuner.configs = lists[key]
    write()
    print(json.dumps(json.loads(args.out.read_text())["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
