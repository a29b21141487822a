"""The pipelined what-if kernel that ``bench_decode.py --pipelined`` times: the goldens' bits in
Triton's interpreter (a partial last block, inactive rows), asynchronous copies in its sm_90 code
only where its loop asks for stages, and the static counts docs/kernels.md quotes."""

from __future__ import annotations

import json

import torch

from gdn_evidence.harness.pipelined_kernel import (
    ONE_SLAB,
    ONE_WARP_8_ROWS,
    PIPELINED,
    compile_pipelined,
    variant_config,
)
from gdn_evidence.harness.sass_mix import HEADS, dims_for, loop_order, pipelined_table
from vllm_gdn_invariant.kernels import codegen, recurrent

from ..doc_blocks import marked_block
from .helpers import REPO_ROOT, run_interpreted

DOC = REPO_ROOT / "docs" / "kernels.md"
EVIDENCE = REPO_ROOT / "docs" / "evidence"
# K = 16, V = 24 in blocks of 8 rows, 4 per program: the last block of a program is past V.
CHECK = """
import json, torch
from gdn_evidence.harness.pipelined_kernel import pipelined_kernel
from tests.harness.interpreted_recurrent import bit_differences, recurrent_case

g = torch.Generator().manual_seed(0)
results = {}
for dtype in (torch.float32, torch.bfloat16):
    case = recurrent_case(g, dtype, 24)
    for stages in (1, 2, 3):
        def launch(grid, arguments, constexprs, stages=stages):
            pipelined_kernel[grid](*arguments, **constexprs, STAGES=stages, num_warps=1)
        results[f"{str(dtype)[6:]} stages={stages}"] = bit_differences(case, 4, launch)
print(json.dumps(results))
"""


def test_the_pipelined_kernel_writes_the_goldens_bits():
    cases = run_interpreted(CHECK)
    assert len(cases) == 6
    for name, case in cases.items():
        assert case["out_bits_differ"] == 0, name
        assert case["state_bits_differ"] == 0, name
        assert case["state_changed"] > 0, name  # the step did update the state


def test_a_variant_replaces_the_shapes_fields_or_splits_k_as_asked():
    default = recurrent.recurrent_config(dims_for(128), torch.bfloat16, interpreted=False)
    moved = variant_config(default, ONE_WARP_8_ROWS | {"chunks": 16}, 128, torch.bfloat16)
    assert (moved.block_v, moved.num_warps, moved.chunks) == (8, 1, 16)
    assert (moved.log2_j, moved.log2_cl, moved.log2_vec) == (
        default.log2_j, default.log2_cl, default.log2_vec
    )  # fmt: skip
    for dtype in (torch.float32, torch.bfloat16):  # one slab: 32 lanes of 4 elements
        slab = variant_config(default, ONE_SLAB, 128, dtype)
        assert (slab.log2_j, slab.log2_cl, slab.log2_vec) == (0, 5, 2)
        assert (slab.block_v, slab.chunks) == (default.block_v, default.chunks)
    assert variant_config(default, None, 128, torch.bfloat16) == default


def sass_counts(compiled, kernel_name: str) -> dict[str, int]:
    sass = codegen.sass_of(compiled.asm["cubin"])
    names = [op.split(".")[0] for op, _ in codegen.sass_functions(sass)[kernel_name]]
    return {op: names.count(op) for op in ("LDGSTS", "LDG")}


def test_the_loop_copies_asynchronously_only_where_it_asks_for_stages():
    """At sm_90: with two stages the state's loads become ``LDGSTS``; one stage with the
    launch's ``num_stages=4`` leaves plain loads, as ours at that shape has."""
    dims = dims_for(128)
    default = recurrent.recurrent_config(dims, torch.bfloat16, interpreted=False)
    config = recurrent.RecurrentConfig(
        **(default.__dict__ | ONE_WARP_8_ROWS | {"chunks": 16})
    )  # fmt: skip
    two = compile_pipelined(HEADS, config, torch.bfloat16, 2, batch=128)
    launch_only = compile_pipelined(HEADS, config, torch.bfloat16, 1, batch=128, num_stages=4)
    ours = codegen.compile_recurrent(dims, state_dtype=torch.bfloat16, config=config)
    assert sass_counts(two, "pipelined_kernel")["LDGSTS"] >= 1 << default.log2_j
    assert sass_counts(launch_only, "pipelined_kernel")["LDGSTS"] == 0
    assert sass_counts(ours, "recurrent_step_kernel")["LDGSTS"] == 0
    assert codegen.report_of(two).clean  # still no contraction
    copies = loop_order(codegen.sass_of(two.asm["cubin"]), "pipelined_kernel", ("LDGSTS",))
    assert copies["place"] == "after the stores"
    loads = loop_order(codegen.sass_of(ours.asm["cubin"]), "recurrent_step_kernel", ("LDG",))
    assert loads["place"].endswith("% of the arithmetic")  # before ours' stores
    assert loads["ahead"][0] < loads["stores"][0] < copies["ahead"][0]


def test_the_static_counts_are_the_variants_and_are_quoted():
    """docs/evidence/sass_pipelined_triton3.6.0.json counts every variant that applies at
    B = 128 beside ours, copies appear where stages are asked for, and docs/kernels.md quotes
    its table."""
    counted = json.loads((EVIDENCE / "sass_pipelined_triton3.6.0.json").read_text())
    assert counted["provenance"]["triton"] == "3.6.0"
    cases = counted["cases"]
    for state in ("fp32", "bf16"):
        arms = [c["arm"] for c in cases if c["state"] == state]
        default_chunks = next(c for c in cases if c["state"] == state and c["default"])
        expected = [
            name
            for name, (fields, _) in PIPELINED.items()
            if (fields or {}).get("chunks", default_chunks["config"]["chunks"]) >= 2
        ]
        assert [a for a in arms if a.startswith("pipelined_")] == expected
    for c in cases:
        asked = c["stages"] is not None and c["stages"] >= 2
        assert (c["async_copies"] > 0) == asked, c["arm"]
        assert not c["spills"]
    text = DOC.read_text()
    assert marked_block(text, "pipelined-counts-table") == pipelined_table(cases)
    later = json.loads((EVIDENCE / "sass_pipelined_triton3.9.0.json").read_text())["cases"]
    assert [(c["arm"], c["config"], c["async_copies"]) for c in later] == [
        (c["arm"], c["config"], c["async_copies"]) for c in cases
    ]
    spread = max(abs(c["registers"] - d["registers"]) for c, d in zip(cases, later, strict=True))
    flat = " ".join(text.split())
    assert f"gives the same copies; registers differ by at most {spread})" in flat
    # two stages: ours' registers or fewer at the same shape
    ours = {(c["state"], str(c["config"])): c for c in cases if c["stages"] is None}
    for c in cases:
        if c["stages"] == 2:
            assert c["registers"] <= ours[(c["state"], str(c["config"]))]["registers"], c["arm"]
    slab = next(c for c in cases if (c["state"], c["arm"]) == ("bf16", "pipelined_s2_w1c16_slab"))
    assert (
        f"one warp of 8 rows takes {slab['registers']} registers with bf16 and two stages, "
        f"{slab['resident_warps_per_sm']} warps per SM" in flat
    )
    for arms in (cases, later):  # every variant's copies go out at the end of the iteration
        for c in arms:
            if (c["stages"] or 1) > 1:
                assert c["loop"]["place"] == "after the stores", c["arm"]
    ours_places = [
        int(c["loop"]["place"].split()[1]) for c in cases if c["stages"] is None and c["loop"]
    ]
    assert (
        f"ours issues the next block's plain loads after {min(ours_places)}–{max(ours_places)} % "
        f"of a block's arithmetic (after 96 % or more in {sum(p >= 96 for p in ours_places)} of "
        f"its {len(ours_places)} shapes)" in flat
    )
    bounded = [c for c in cases if c["occupancy_bound"] == "shared"]
    assert [(c["state"], c["arm"]) for c in bounded] == [
        ("fp32", "pipelined_s3_w1c16_slab"), ("fp32", "pipelined_s4_w1c16_slab")
    ]  # fmt: skip
    three, four = (c["resident_warps_per_sm"] for c in bounded)
    assert f"the shared memory bounds it ({three} and {four} warps per SM)" in flat
