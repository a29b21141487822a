"""The kernels' generated NVIDIA code, checked for contraction and approximate functions.

Every launch passes ``enable_fp_fusion=False``: Triton then lowers LLVM with FP contraction off,
which writes each fp32 add, sub and mul of the kernels as its own ``add.rn``/``sub.rn``/
``mul.rn`` PTX instruction (an explicit rounding modifier, which ptxas never contracts), and
calls ptxas with ``--fmad=false``. ``contraction_report`` checks the result at both levels:

* PTX: no ``fma``/``mad`` on f32; every f32 add, sub and mul carries ``.rn``; no approximate
  instruction (``ex2``/``lg2``/``rcp``/``rsqrt``/``sqrt``/``sin``/``cos``/``tanh`` ``.approx``,
  ``div.full``, ``div.approx``);
* SASS (nvdisasm of the cubin): every FFMA of the kernel's own code is one of the FFMAs of an
  IEEE ``div.rn.f32`` expansion (a ``MUFU.RCP`` and the 5 FFMAs that refine it) or of a
  ``sqrt.rn.f32`` expansion (a ``MUFU.RSQ`` and 2 FFMAs), found by following the registers
  from each MUFU; the only other FFMAs are in ptxas's ``__internal_*`` div/sqrt slow paths.

``compile_recurrent`` and ``compile_conv`` build the kernels for a target with
``triton.compile`` on meta tensors, so the check runs without a GPU (Triton's wheel ships ptxas
and nvdisasm); the GPU test runs the same report on the kernels its launches compiled.
``python -m vllm_gdn_invariant.kernels.codegen`` prints the report for Qwen3-Next's shapes.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import conv as conv_module
from . import recurrent as recurrent_module
from . import replay as replay_module
from .replay import ReplayDims
from .validation import ConvDims, RecurrentDims

TRITON_TYPES = {
    torch.float64: "fp64",
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.int8: "i8",
    torch.bool: "i1",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
}
APPROXIMATE_PTX = re.compile(
    r"\b(?:(?:ex2|lg2|rcp|rsqrt|sqrt|sin|cos|tanh)\.approx|div\.(?:full|approx))\b"
)
FUSED_PTX = re.compile(r"\b(?:fma|mad)(?:\.[a-z0-9]+)*\.f32\b")
FP32_ARITHMETIC_PTX = re.compile(r"\b(add|sub|mul)((?:\.[a-z0-9]+)*)\.f32\b")
SASS_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z0-9_.]+)\s*([^;]*);")
SASS_REGISTER = re.compile(r"\bR(\d+)\b")
FFMAS_PER_EXPANSION = {"MUFU.RCP": 5, "MUFU.RSQ": 2}  # div.rn.f32, sqrt.rn.f32 fast paths
SLOW_PATH = re.compile(r"__internal_\d+_\$__cuda_sm\w*_(?:div_rn|sqrt_rn)\w*_slowpath")


@dataclass(frozen=True)
class ContractionReport:
    """What the generated code of one kernel contains (module docstring)."""

    ptx_fused: int  # fma/mad f32 instructions in PTX
    ptx_unrounded: int  # f32 add/sub/mul without .rn in PTX
    ptx_approximate: int  # approximate instructions in PTX
    ptx_rounded_ops: int  # f32 add.rn/sub.rn/mul.rn in PTX
    ptx_div_rn: int
    ptx_sqrt_rn: int
    sass_ffma_in_expansions: int  # FFMAs of div.rn/sqrt.rn fast paths
    sass_ffma_in_slow_paths: int  # FFMAs in ptxas's div/sqrt slow-path routines
    sass_ffma_unexplained: tuple[str, ...]  # any other FFMA (a contraction)

    @property
    def expected_expansion_ffmas(self) -> int:
        """FFMAs that the fast paths of the PTX's div.rn and sqrt.rn take: 5 and 2 each."""
        return 5 * self.ptx_div_rn + 2 * self.ptx_sqrt_rn

    @property
    def clean(self) -> bool:
        """No contraction and no approximate instruction at either level, and the FFMAs found
        in expansions are exactly those the PTX's divisions and square roots take."""
        return (
            self.ptx_fused == 0
            and self.ptx_unrounded == 0
            and self.ptx_approximate == 0
            and not self.sass_ffma_unexplained
            and self.sass_ffma_in_expansions == self.expected_expansion_ffmas
        )


def nvidia_tool(name: str) -> Path:
    """A binary that Triton's NVIDIA backend ships (ptxas, nvdisasm, cuobjdump)."""
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def sass_of(cubin: bytes) -> str:
    """The cubin disassembled by nvdisasm."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        result = subprocess.run(
            [str(nvidia_tool("nvdisasm")), "-c", str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
    return result.stdout


def sass_functions(sass: str) -> dict[str, list[tuple[str, str]]]:
    """Instructions (opcode, operands) of each function of a disassembly, by label."""
    functions: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in sass.splitlines():
        label = re.match(r"^([$\w.]+):\s*$", line)
        if label and not label.group(1).startswith((".L", ".text")):
            current = label.group(1)
            functions.setdefault(current, [])
            continue
        instruction = SASS_INSTRUCTION.search(line)
        if instruction and current is not None:
            functions[current].append((instruction.group(1), instruction.group(2).strip()))
    return functions


def ffmas_outside_expansions(instructions: list[tuple[str, str]]) -> tuple[int, list[str]]:
    """(FFMAs inside div.rn/sqrt.rn fast paths, the other FFMAs) of one function.

    A MUFU.RCP/RSQ starts an expansion with a budget of FFMAs (5 / 2). An FFMA or FMUL.FTZ that
    reads a register written inside an unfinished expansion belongs to it (an FFMA spends one
    of its budget) and its destination joins it; a write by any other instruction except MOV
    ends a register's membership (the instructions are scanned in address order, and the MOVs
    around a slow-path call sit between a MUFU and its fast path). An FFMA beyond a budget is
    not in an expansion, so a contraction cannot hide in one.
    """
    owner: dict[str, int] = {}  # register -> expansion id
    budget: dict[int, int] = {}
    inside, outside = 0, []
    for opcode, operands in instructions:
        registers = SASS_REGISTER.findall(operands)
        destination, sources = (registers[0], registers[1:]) if registers else (None, [])
        base = opcode.split(".")[0]
        expansion = None
        if opcode in FFMAS_PER_EXPANSION:
            expansion = len(budget)
            budget[expansion] = FFMAS_PER_EXPANSION[opcode]
        elif base in ("FFMA", "FMUL") and (base == "FFMA" or ".FTZ" in opcode):
            owners = [owner[r] for r in sources if r in owner and budget[owner[r]] > 0]
            if owners:
                expansion = owners[0]
                if base == "FFMA":
                    budget[expansion] -= 1
                    inside += 1
            elif base == "FFMA":
                outside.append(f"{opcode} {operands}")
        if destination is not None and expansion is not None:
            owner[destination] = expansion
        elif destination is not None and base != "MOV":
            owner.pop(destination, None)
    return inside, outside


def contraction_report(ptx: str, sass: str) -> ContractionReport:
    """Check a kernel's PTX and SASS (module docstring)."""
    arithmetic = FP32_ARITHMETIC_PTX.findall(ptx)
    inside, outside, slow = 0, [], 0
    for name, instructions in sass_functions(sass).items():
        if SLOW_PATH.search(name):
            slow += sum(1 for opcode, _ in instructions if opcode.split(".")[0] == "FFMA")
            continue
        function_inside, function_outside = ffmas_outside_expansions(instructions)
        inside += function_inside
        outside += [f"{name}: {text}" for text in function_outside]
    return ContractionReport(
        ptx_fused=len(FUSED_PTX.findall(ptx)),
        ptx_unrounded=sum(1 for _, modifiers in arithmetic if ".rn" not in modifiers),
        ptx_approximate=len(APPROXIMATE_PTX.findall(ptx)),
        ptx_rounded_ops=sum(1 for _, modifiers in arithmetic if ".rn" in modifiers),
        ptx_div_rn=len(re.findall(r"\bdiv\.rn(?:\.[a-z]+)*\.f32\b", ptx)),
        ptx_sqrt_rn=len(re.findall(r"\bsqrt\.rn(?:\.[a-z]+)*\.f32\b", ptx)),
        sass_ffma_in_expansions=inside,
        sass_ffma_in_slow_paths=slow,
        sass_ffma_unexplained=tuple(outside),
    )


@dataclass(frozen=True)
class ResourceUsage:
    """Per-thread resources of a compiled kernel (cuobjdump's resource usage)."""

    registers: int
    stack: int  # bytes of stack frame
    local: int  # bytes of local memory: register spills (the kernels have no local arrays)
    shared: int  # bytes of static shared memory per program

    @property
    def spills(self) -> bool:
        return self.local > 0 or self.stack > 0


def resource_usage(compiled: object) -> ResourceUsage:
    """The registers, stack, local and shared memory of a compiled kernel's cubin."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(compiled.asm["cubin"])
        result = subprocess.run(
            [str(nvidia_tool("cuobjdump")), "--dump-resource-usage", str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
    usage = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", result.stdout))
    return ResourceUsage(
        registers=int(usage["REG"]),
        stack=int(usage["STACK"]),
        local=int(usage["LOCAL"]),
        shared=int(usage["SHARED"]),
    )


def report_of(compiled: object) -> ContractionReport:
    """contraction_report of a compiled kernel (what a launch or ``triton.compile`` returns)."""
    return contraction_report(compiled.asm["ptx"], sass_of(compiled.asm["cubin"]))


def signature_of(kernel: triton.runtime.JITFunction, arguments: tuple, constexprs: dict):
    """ASTSource signature, constexprs and attributes for these launch arguments, specialized
    the way Triton's launcher specializes them (ints equal to 1 become constants; pointers and
    multiples of 16 are marked 16-divisible)."""
    names = kernel.arg_names
    values = dict(zip(names, arguments, strict=False)) | constexprs
    signature, constants, attributes = {}, {}, {}
    for index, name in enumerate(names):
        value = values[name]
        if name in constexprs:
            signature[name] = "constexpr"
            constants[(index,)] = value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + TRITON_TYPES[value.dtype]
            attributes[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif value == 1:
            signature[name] = "constexpr"
            constants[(index,)] = 1
        else:
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                attributes[(index,)] = [["tt.divisibility", 16]]
    return signature, constants, attributes


def compile_kernel(
    kernel,
    arguments,
    constexprs,
    num_warps: int,
    capability: int,
    fusion: bool,
    options: dict | None = None,
):
    """``kernel`` compiled for ``sm_<capability>`` on these arguments, with Triton's compile
    ``options`` beside ``num_warps`` and contraction (``maxnreg``, for one)."""
    signature, constants, attributes = signature_of(kernel, arguments, constexprs)
    return triton.compile(
        ASTSource(kernel, signature, constants, attributes),
        target=GPUTarget("cuda", capability, 32),
        options={"num_warps": num_warps, "enable_fp_fusion": fusion, **(options or {})},
    )


def meta(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def compile_recurrent(
    dims: RecurrentDims,
    *,
    state_dtype: torch.dtype = torch.float32,
    mixed_dtype: torch.dtype = torch.bfloat16,
    num_blocks: int = 1024,
    capability: int = 90,
    fusion: bool = False,
    config: recurrent_module.RecurrentConfig | None = None,
    module: ModuleType = recurrent_module,
    options: dict | None = None,
):
    """``module.recurrent_step_kernel`` (``kernels.recurrent``, or another version of that
    module) compiled for ``sm_<capability>`` at ``config``, by default the module's default
    launch shape (``fusion=True`` compiles it with contraction on, for comparison; ``options``:
    other Triton compile options, as ``compile_kernel``)."""
    H, HV, K, V = dims.num_k_heads, dims.num_v_heads, dims.head_k, dims.head_v
    mixed_qkv = meta((dims.batch, 2 * H * K + HV * V), mixed_dtype)
    gates = meta((dims.batch, HV), mixed_dtype)
    out = meta((dims.batch, 1, HV, V), mixed_dtype)
    state = meta((num_blocks, HV, V, K), state_dtype)
    if config is None:
        config = module.recurrent_config(dims, state_dtype, interpreted=False)
    _, arguments, constexprs = module.kernel_arguments(
        mixed_qkv,
        gates,
        gates,
        meta((HV,), torch.float32),
        meta((HV,), torch.float32),
        out,
        state,
        meta((dims.batch,), torch.int32),
        dims,
        config,
    )
    return compile_kernel(
        module.recurrent_step_kernel,
        arguments,
        constexprs,
        config.num_warps,
        capability,
        fusion,
        options,
    )


def compile_conv(
    dims: ConvDims,
    *,
    cache_dtype: torch.dtype = torch.bfloat16,
    x_dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype = torch.bfloat16,
    with_bias: bool = True,
    num_blocks: int = 1024,
    capability: int = 90,
    fusion: bool = False,
):
    """conv_update_kernel compiled for ``sm_<capability>`` with the default launch shape."""
    shape = (num_blocks, dims.dim, dims.taps - 1)
    if not dims.dim_first:
        shape = (num_blocks, dims.taps - 1, dims.dim)
    weight = meta((dims.dim, dims.taps), weight_dtype)
    config = conv_module.conv_config(dims, interpreted=False)
    _, arguments, constexprs = conv_module.kernel_arguments(
        meta((dims.batch, dims.dim), x_dtype),
        meta(shape, cache_dtype),
        weight,
        meta((dims.batch,), torch.int32),
        meta((dims.dim,), weight_dtype) if with_bias else None,
        meta((dims.batch, dims.dim), x_dtype),
        dims,
        config,
    )
    return compile_kernel(
        conv_module.conv_update_kernel,
        arguments,
        constexprs,
        config.num_warps,
        capability,
        fusion,
    )


def compile_replay(
    dims: ReplayDims,
    *,
    state_dtype: torch.dtype = torch.float32,
    x_dtype: torch.dtype = torch.bfloat16,
    conv_dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype = torch.bfloat16,
    with_bias: bool = False,
    tokens: int = 8192,
    num_blocks: int = 1024,
    capability: int = 90,
    fusion: bool = False,
    config: replay_module.ReplayConfig | None = None,
    multiprocessors: int = replay_module.H200_MULTIPROCESSORS,
) -> object:
    """replay_kernel compiled for ``sm_<capability>`` with the default launch shape for ``dims``
    on a GPU of ``multiprocessors`` SMs (or ``config``), the conv layout and options of ``dims``
    (by default Qwen3-Next's: SiLU, QK norm) and no conv bias unless ``with_bias``."""
    H, HV, K, V = dims.num_k_heads, dims.num_v_heads, dims.head_k, dims.head_v
    dim = 2 * H * K + HV * V
    sequences = dims.num_sequences
    conv_shape = (num_blocks, dim, dims.taps - 1)
    if not dims.dim_first:
        conv_shape = (num_blocks, dims.taps - 1, dim)
    if config is None:
        config = replay_module.replay_config(dims, state_dtype, multiprocessors, interpreted=False)
    tensors = replay_module.ReplayTensors(
        x=meta((tokens, dim), x_dtype),
        a=meta((tokens, HV), x_dtype),
        b=meta((tokens, HV), x_dtype),
        A_log=meta((HV,), torch.float32),
        dt_bias=meta((HV,), torch.float32),
        conv_weight=meta((dim, dims.taps), weight_dtype),
        conv_bias=meta((dim,), weight_dtype) if with_bias else None,
        conv_state=meta(conv_shape, conv_dtype),
        conv_indices=meta((sequences,), torch.int32),
        state=meta((num_blocks, HV, V, K), state_dtype),
        state_indices=meta((sequences,), torch.int32),
        cu_seqlens=meta((sequences + 1,), torch.int32),
    )
    out = meta((tokens, HV, V), x_dtype)
    _, arguments, constexprs = replay_module.kernel_arguments(tensors, out, dims, config)
    return compile_kernel(
        replay_module.replay_kernel, arguments, constexprs, config.num_warps, capability, fusion
    )


def summary(report: ContractionReport) -> dict:
    """The report as a dict, with its expected expansion FFMAs and verdict."""
    return asdict(report) | {
        "expected_expansion_ffmas": report.expected_expansion_ffmas,
        "clean": report.clean,
    }


def qwen3_next_reports(capability: int = 90, fusion: bool = False) -> dict[str, dict]:
    """Reports for Qwen3-Next's per-rank shapes (TP1), both state dtypes, and the conv update."""
    reports = {}
    for state_dtype in (torch.float32, torch.bfloat16):
        for use_qk_l2norm in (True, False):
            dims = RecurrentDims(64, 16, 32, 128, 128, 128**-0.5, use_qk_l2norm)
            compiled = compile_recurrent(
                dims, state_dtype=state_dtype, capability=capability, fusion=fusion
            )
            name = f"recurrent state={TRITON_TYPES[state_dtype]} qk_norm={use_qk_l2norm}"
            reports[name] = summary(report_of(compiled))
    for cache_dtype in (torch.float32, torch.bfloat16):
        for dim_first in (True, False):
            dims = ConvDims(64, 8192, 4, dim_first, True)
            compiled = compile_conv(
                dims, cache_dtype=cache_dtype, capability=capability, fusion=fusion
            )
            name = f"conv cache={TRITON_TYPES[cache_dtype]} dim_first={dim_first}"
            reports[name] = summary(report_of(compiled))
    return reports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capability", type=int, default=90)
    parser.add_argument("--fusion", action="store_true", help="compile with contraction on")
    args = parser.parse_args()
    reports = qwen3_next_reports(args.capability, args.fusion)
    print(json.dumps(reports, indent=1))
    return 0 if all(r["clean"] for r in reports.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
