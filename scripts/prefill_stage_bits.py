"""Which stage of vLLM's FLA chunk prefill gives a sequence other bits among others (GPU).

    python scripts/prefill_stage_bits.py --out prefill_stage_bits.json

A target sequence's rows through each stage of ``chunk_gated_delta_rule`` (l2norm of q and k,
chunk cumsum of the log decay, ``chunk_scaled_dot_kkt_fwd``, ``solve_tril``,
``recompute_w_u_fwd``, ``chunk_gated_delta_rule_fwd_h``, ``chunk_fwd_o``), alone and inside a
varlen batch, compared bit for bit stage by stage. Placements: the target after sequences of
300 and 17 tokens (an offset off the 64 grid), after 320 tokens (on it) and first; the alone
run takes fresh copies of the target's rows and runs twice (run-to-run repeatability). JSON
with provenance: per placement and stage, the count of differing elements of the target's
part, batched vs alone and alone vs alone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path
import torch

from gdn_evidence.harness.autotune import autotuned_configs
from gdn_evidence.harness.chunk_prefill import cu_seqlens, varlen_inputs
from gdn_evidence.harness.provenance import provenance
from vllm_gdn_invariant.shadow.bits import differ

HV, K, V, BT = 8, 128, 128, 64
PLACEMENTS = {
    "after_317": ([300, 17], [1024, 64, 5]),
    "after_320": ([320], [1024, 64, 5]),
    "first": ([], [300, 17, 1024, 64, 5]),
}
TARGETS = (63, 200, 700)


def stages(q, k, v, g, beta, lengths: list[int]) -> dict[str, torch.Tensor]:
    """Every intermediate of vLLM's chunk prefill for the varlen batch ``lengths``."""
    from vllm.third_party.flash_linear_attention.ops.chunk_delta_h import (
        chunk_gated_delta_rule_fwd_h,
    )
    from vllm.third_party.flash_linear_attention.ops.chunk_o import chunk_fwd_o
    from vllm.third_party.flash_linear_attention.ops.chunk_scaled_dot_kkt import (
        chunk_scaled_dot_kkt_fwd,
    )
    from vllm.third_party.flash_linear_attention.ops.cumsum import chunk_local_cumsum
    from vllm.third_party.flash_linear_attention.ops.l2norm import l2norm_fwd
    from vllm.third_party.flash_linear_attention.ops.solve_tril import solve_tril
    from vllm.third_party.flash_linear_attention.ops.wy_fast import recompute_w_u_fwd

    cu = cu_seqlens(lengths, "cuda")
    initial = torch.zeros(len(lengths), HV, V, K, dtype=torch.float32, device="cuda")
    out: dict[str, torch.Tensor] = {}
    out["q_l2"] = q = l2norm_fwd(q)
    out["k_l2"] = k = l2norm_fwd(k)
    out["g_cumsum"] = g = chunk_local_cumsum(g, chunk_size=BT, cu_seqlens=cu)
    out["kkt"] = a = chunk_scaled_dot_kkt_fwd(
        k=k, beta=beta, g=g, cu_seqlens=cu, output_dtype=torch.float32
    )
    out["solve_tril"] = a = solve_tril(A=a, cu_seqlens=cu, output_dtype=k.dtype)
    w, u = recompute_w_u_fwd(k=k, v=v, beta=beta, A=a, g_cumsum=g, cu_seqlens=cu)
    out["w"], out["u"] = w, u
    h, v_new, final = chunk_gated_delta_rule_fwd_h(
        k=k, w=w, u=u, g=g, initial_state=initial, output_final_state=True, cu_seqlens=cu
    )
    out["h"], out["v_new"], out["final"] = h, v_new, final
    out["o"] = chunk_fwd_o(q=q, k=k, v=v_new, h=h, g=g, scale=K**-0.5, cu_seqlens=cu)
    torch.cuda.synchronize()
    return out


def target_part(name: str, t: torch.Tensor, start: int, length: int, chunk0: int, index: int):
    """The target's part of one intermediate: its token rows, its chunks, its final state."""
    if name == "h":
        return t[:, chunk0 : chunk0 + -(-length // BT)]
    if name == "final":
        return t[index : index + 1]
    return t[:, start : start + length]


def compare(before: list[int], after: list[int], length: int, seed: int) -> dict:
    lengths = [*before, length, *after]
    start = sum(before)
    batch_inputs = varlen_inputs(sum(lengths), seed, HV, K, V, "cuda")
    alone_inputs = [t[:, start : start + length].clone() for t in batch_inputs]
    batched = stages(*batch_inputs, lengths)
    alone = stages(*alone_inputs, [length])
    again = stages(*alone_inputs, [length])
    chunk0 = sum(-(-n // BT) for n in before)
    result = {}
    for name, tensor in batched.items():
        part = target_part(name, tensor, start, length, chunk0, len(before))
        mine = target_part(name, alone[name], 0, length, 0, 0)
        result[name] = {
            "differing": differ(part, mine),
            "differing_alone_twice": differ(mine, target_part(name, again[name], 0, length, 0, 0)),
            "elements": part.numel(),
        }
    return {"lengths": lengths, "start": start, "stages": result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs CUDA")
    cases = []
    for placement, (before, after) in PLACEMENTS.items():
        for length in TARGETS:
            case = {"placement": placement, "target": length}
            case.update(compare(before, after, length, seed=length))
            cases.append(case)
            batch = [n for n, s in case["stages"].items() if s["differing"]]
            twice = [n for n, s in case["stages"].items() if s["differing_alone_twice"]]
            print(
                placement,
                length,
                "batched vs alone:",
                batch or "none",
                "alone twice:",
                twice or "none",
                flush=True,
            )
            args.out.write_text(
                json.dumps(
                    {"provenance": provenance(), "configs": autotuned_configs(), "cases": cases},
                    indent=1,
                ),
                encoding="utf-8",
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
