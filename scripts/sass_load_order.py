"""Where ptxas puts the recurrent kernel's global loads among its arithmetic, per register cap
(CPU: compiles for sm_90 with Triton's bundled ptxas; no GPU needed).

    python scripts/sass_load_order.py [--batch 128] [--state bf16] [--out FILE.json]

For Qwen3-Next's TP1 heads at the default launch shape (``kernels.recurrent.recurrent_config``)
and ptxas's own register choice or a ``maxnreg`` cap, prints the registers used and the kernel's
global loads (L), stores (S), fp32 adds/multiplies/FMAs (f, runs of five or more as f<count>),
barriers (B) and branches (|) in program order, for PTX (the order Triton writes) and SASS (the
order ptxas schedules). In a loop whose next block's loads come before the current block's
arithmetic in PTX, the SASS shows where ptxas moved them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path
import torch
import triton

from gdn_evidence.harness.launch_shapes import qwen3_next_dims
from gdn_evidence.harness.provenance import provenance
from vllm_gdn_invariant.kernels import codegen
from vllm_gdn_invariant.kernels import recurrent as recurrent_kernel

STATES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CAPS = (None, 168, 255)
SASS_CLASSES = {
    "LDG": "L",
    "STG": "S",
    "FMUL": "f",
    "FADD": "f",
    "FFMA": "f",
    "BAR": "B",
    "BRA": "|",
}
PTX_CLASSES = (
    (re.compile(r"ld\.global"), "L"),
    (re.compile(r"st\.global"), "S"),
    (re.compile(r"(?:add|sub|mul|fma)\.rn\.f32"), "f"),
    (re.compile(r"bar\.sync"), "B"),
    (re.compile(r"bra(?:\.uni)?\s"), "|"),
)


def runs(sequence: str) -> str:
    """Runs of five or more ``f`` written as ``f<count>``."""
    return re.sub(r"f{5,}", lambda m: f"f{len(m.group())}", sequence)


def sass_order(cubin: bytes) -> str:
    sass = codegen.sass_of(cubin)
    opcodes = [
        m.group(1) for line in sass.splitlines() if (m := codegen.SASS_INSTRUCTION.search(line))
    ]
    return runs("".join(SASS_CLASSES.get(op.split(".")[0], "") for op in opcodes))


def ptx_order(ptx: str) -> str:
    marks = []
    for line in ptx.splitlines():
        text = re.sub(r"^@!?%p\d+\s+", "", line.strip())
        marks.extend(mark for pattern, mark in PTX_CLASSES if pattern.match(text))
    return runs("".join(marks))


def compiled(batch: int, state_dtype: torch.dtype, maxnreg: int | None):
    dims = qwen3_next_dims(batch)
    config = recurrent_kernel.recurrent_config(dims, state_dtype, interpreted=False)
    options = None if maxnreg is None else {"maxnreg": maxnreg}
    kernel = codegen.compile_recurrent(
        dims, state_dtype=state_dtype, num_blocks=1024, config=config, options=options
    )
    return config, kernel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--state", choices=sorted(STATES), default="bf16")
    parser.add_argument("--out", type=Path, help="JSON file to write")
    args = parser.parse_args(argv)
    cases = []
    for cap in CAPS:
        config, kernel = compiled(args.batch, STATES[args.state], cap)
        case = {
            "maxnreg": cap,
            "config": config.__dict__,
            "registers": codegen.resource_usage(kernel).registers,
            "ptx": ptx_order(kernel.asm["ptx"]),
            "sass": sass_order(kernel.asm["cubin"]),
        }
        cases.append(case)
        print(f"maxnreg={cap} registers={case['registers']}")
        print(f"  PTX  {case['ptx']}\n  SASS {case['sass']}")
    if args.out is not None:
        report = {
            "provenance": provenance(batch=args.batch, state=args.state, triton=triton.__version__),
            "cases": cases,
        }
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
