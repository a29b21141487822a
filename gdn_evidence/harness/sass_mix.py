"""Static instruction mix of the recurrent decode kernels, compiled for an NVIDIA target on any
machine (Triton's wheel ships ptxas and nvdisasm; ``kernels.codegen`` compiles on meta tensors).

Arms, each compiled for Qwen3-Next's TP1 heads (H=16, HV=32, K=V=128) and one state dtype:

* ``vllm``: vLLM's ``fused_recurrent_gated_delta_rule_packed_decode_kernel``, read from a
  release's ``fused_recurrent.py`` and compiled as vLLM launches it (one warp, ``BV`` value rows,
  contraction on: Triton's default), see ``vllm_block_v``;
* ``ours``: ``kernels.recurrent.recurrent_step_kernel`` at its default launch shape for the
  batch size, contraction off (what mode golden launches);
* ``ours_contracted``: the same source compiled with contraction on (ptxas fuses products into
  the adds that follow them): what the no-FMA rule costs; its bits are not the golden's;
* ``ours_chunked``: the golden-matched kernel at ``CHUNKED``, programs of one warp that take
  all 128 value rows of a head in 16 blocks of 8 (the q/k norms and gates once per program,
  the next block's loads before this block's arithmetic), 32 elements of a row per thread in
  four 16-byte vectors for a bf16 state (eight 8-byte ones);
* ``what_if_grouped`` and ``what_if_grouped_fma``: ``what_if_kernel``'s kernel, another
  golden's reduction order (groups of 4 first) without and with FMAs (it spills with an fp32
  state under Triton 3.9.0, not under 3.6.0).

A program's code is straight-line for an active row (every loop is unrolled) but for the loop
over a program's blocks of value rows, so the static count of the kernel function (ptxas's
div/sqrt slow-path functions left out), plus the loop's body once more for each block after
the first, is what a thread issues per step. "Per element" divides it by the state elements a
thread holds over the step (BV * chunks * K / threads per program).
"""

from __future__ import annotations

import ast
import collections
import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

from vllm_gdn_invariant.kernels import codegen, recurrent
from vllm_gdn_invariant.kernels.validation import RecurrentDims

from . import launch_shapes, pipelined_kernel, what_if_kernel
from .scratch import scratch_folder

VLLM_KERNEL = "fused_recurrent_gated_delta_rule_packed_decode_kernel"
VLLM_LAUNCHER = "fused_recurrent_gated_delta_rule_packed_decode"
FUSED_RECURRENT = Path("third_party/flash_linear_attention/ops/fused_recurrent.py")
HEADS = launch_shapes.QWEN3_NEXT_HEADS
REGISTERS = 65536  # per SM on sm_90
MAX_WARPS = 64  # resident warps per SM on sm_90
REGISTER_UNIT = 8  # a thread's registers are allocated in multiples of 8
MAX_PROGRAMS = 32  # resident programs (thread blocks) per SM on sm_90
SHARED_PER_SM = 228 * 1024  # bytes of shared memory per SM on sm_90
SHARED_RESERVED = 1024  # bytes the driver reserves per resident program
CLASSES = {
    "fp32_arithmetic": ("FADD", "FMUL", "FFMA"),
    "shuffles": ("SHFL",),
    "conversions_and_shifts": ("F2FP", "PRMT", "SHF"),
    "global_memory": ("LDG", "STG"),
    "shared_memory": ("LDS", "STS", "LDSM", "STSM"),
    "local_memory": ("LDL", "STL"),
}


CHUNKED = recurrent.RecurrentConfig(
    block_v=8, log2_j=3, log2_cl=2, log2_vec=2, num_warps=1, chunks=16
)  # for K = V = 128, either state dtype
BRANCH_TARGET = re.compile(r"`\((\.L\w+)\)")


@dataclass(frozen=True)
class Arm:
    """One compiled kernel and its launch shape."""

    name: str
    compiled: object
    kernel_name: str
    block_v: int
    num_warps: int
    chunks: int = 1


def installed_vllm_source() -> Path:
    """The installed vLLM's ``fused_recurrent.py``."""
    import vllm

    return Path(vllm.__file__).parent / FUSED_RECURRENT


@functools.cache
def vllm_kernel(source: Path) -> triton.runtime.JITFunction:
    """vLLM's packed decode kernel from a release's ``fused_recurrent.py``, under this Triton.

    The function's source is written to a module of its own with ``tl``, ``triton`` and the
    module's ``exp`` (``tl.exp``, FLA_USE_FAST_OPS unset), so the CPU build's placeholder
    ``vllm.triton_utils`` is not involved. Once per source and process.
    """
    text = Path(source).read_text()
    node = next(
        (
            n
            for n in ast.parse(text).body
            if isinstance(n, ast.FunctionDef) and n.name == VLLM_KERNEL
        ),
        None,
    )
    if node is None:
        raise ValueError(f"{source} has no function {VLLM_KERNEL}")
    body = text.splitlines()[node.lineno - 1 : node.end_lineno]  # def line to the end
    header = "import triton\nimport triton.language as tl\n\nexp = tl.exp\n\n\n@triton.jit\n"
    path = scratch_folder("vllm_packed_decode_") / "vllm_packed_decode.py"
    path.write_text(header + "\n".join(body) + "\n")
    spec = importlib.util.spec_from_file_location("vllm_packed_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, VLLM_KERNEL)


def vllm_block_v(source: Path, state_dtype: torch.dtype, capability: int) -> int:
    """The value rows per program vLLM's launcher picks for K = V = 128 on sm_``capability``.

    32 (``min(next_power_of_2(V), 32)``), except where the launcher has an SM90 fp32 branch
    ("Tuned on H200", vLLM 0.34): 4 for an fp32 state on sm_90. Blackwell's branch is not
    modelled (the arms are compiled for sm_90).
    """
    text = Path(source).read_text()
    launcher = text.split(f"def {VLLM_LAUNCHER}(", 1)[1]
    sm90_fp32_branch = "is_device_capability(90" in launcher and "BV = 4" in launcher
    if sm90_fp32_branch and capability == 90 and state_dtype == torch.float32:
        return 4
    return 32


def compile_vllm(source: Path, state_dtype: torch.dtype, batch: int, capability: int) -> Arm:
    """vLLM's kernel compiled as its launcher calls it (one warp, contraction on)."""
    meta = codegen.meta
    H, HV, K, V = HEADS["H"], HEADS["HV"], HEADS["K"], HEADS["V"]
    block_v = vllm_block_v(source, state_dtype, capability)
    mixed = meta((batch, 2 * H * K + HV * V), torch.bfloat16)
    gates = meta((batch, HV), torch.bfloat16)
    state = meta((1024, HV, V, K), state_dtype)
    arguments = (
        mixed, gates, gates, meta((HV,), torch.float32), meta((HV,), torch.float32),
        meta((batch, 1, HV, V), torch.bfloat16), state, state, meta((batch,), torch.int32),
        K**-0.5,
    )  # fmt: skip
    constexprs = {
        "stride_mixed_qkv_tok": mixed.stride(0),
        "stride_a_tok": HV,
        "stride_b_tok": HV,
        "stride_init_state_token": state.stride(0),
        "stride_final_state_token": state.stride(0),
        "stride_indices_seq": 1,
        **HEADS,
        "BK": K,
        "BV": block_v,
        "SOFTPLUS_THRESHOLD": 20.0,
        "USE_QK_L2NORM_IN_KERNEL": True,
        "SPLIT_BATCH_HEAD_GRID": False,
    }
    compiled = codegen.compile_kernel(
        vllm_kernel(source), arguments, constexprs, 1, capability, fusion=True
    )
    return Arm("vllm", compiled, VLLM_KERNEL, block_v, 1)


def dims_for(batch: int) -> RecurrentDims:
    return launch_shapes.qwen3_next_dims(batch)


def compile_ours(state_dtype: torch.dtype, batch: int, capability: int, fusion: bool) -> Arm:
    """The golden-matched kernel at its default launch shape."""
    dims = dims_for(batch)
    config = recurrent.recurrent_config(dims, state_dtype, interpreted=False)
    compiled = codegen.compile_recurrent(
        dims, state_dtype=state_dtype, capability=capability, fusion=fusion
    )
    name = "ours_contracted" if fusion else "ours"
    return Arm(
        name, compiled, "recurrent_step_kernel", config.block_v, config.num_warps, config.chunks
    )


def compile_chunked(state_dtype: torch.dtype, batch: int, capability: int) -> Arm:
    """The golden-matched kernel at ``CHUNKED``."""
    compiled = codegen.compile_recurrent(
        dims_for(batch), state_dtype=state_dtype, capability=capability, config=CHUNKED
    )
    return Arm(
        "ours_chunked",
        compiled,
        "recurrent_step_kernel",
        CHUNKED.block_v,
        CHUNKED.num_warps,
        CHUNKED.chunks,
    )


def loop_bodies(sass: str, kernel_name: str) -> list[tuple[int, int]]:
    """The loops of ``kernel_name`` in a disassembly, as [start, end) ranges of its
    instructions (``codegen.sass_functions``' indices): from a backward branch's target label
    to the branch; the branch to itself after the kernel's EXIT is no loop."""
    labels: dict[str, int] = {}
    bodies = []
    current, count = None, 0
    for line in sass.splitlines():
        label = re.match(r"^([$\w.]+):\s*$", line)
        if label:
            if not label.group(1).startswith((".L", ".text")):
                current = label.group(1)
            elif current == kernel_name:
                labels[label.group(1)] = count
            continue
        instruction = codegen.SASS_INSTRUCTION.search(line)
        if instruction is None or current != kernel_name:
            continue
        target = BRANCH_TARGET.search(instruction.group(2))
        if instruction.group(1).startswith("BRA") and target and target.group(1) in labels:
            if labels[target.group(1)] < count:
                bodies.append((labels[target.group(1)], count + 1))
        count += 1
    return bodies


def compile_what_if(state_dtype: torch.dtype, batch: int, capability: int, fma: bool) -> Arm:
    """what_if_kernel's kernel at our default launch shape."""
    config = recurrent.recurrent_config(dims_for(batch), state_dtype, interpreted=False)
    compiled = what_if_kernel.compile_grouped(
        HEADS, config, state_dtype, batch=batch, capability=capability, fma=fma
    )
    name = "what_if_grouped_fma" if fma else "what_if_grouped"
    return Arm(name, compiled, what_if_kernel.KERNEL_NAME, config.block_v, config.num_warps)


def register_bound_programs(registers: int, num_warps: int) -> int:
    """Programs of ``num_warps`` warps per SM that the registers allow."""
    per_thread = -(-registers // REGISTER_UNIT) * REGISTER_UNIT
    return REGISTERS // (per_thread * 32 * num_warps)


def resident_warps(registers: int, num_warps: int) -> int:
    """Warps per SM that the registers allow, whole programs only."""
    return min(MAX_WARPS // num_warps, register_bound_programs(registers, num_warps)) * num_warps


def resident_programs(registers: int, num_warps: int, shared: int) -> tuple[int, str]:
    """Programs per SM and what bounds them: ``registers``, ``shared`` memory or ``programs``
    (the limit of programs or warps per SM), the first of them where several do."""
    bounds = {
        "registers": register_bound_programs(registers, num_warps),
        "shared": SHARED_PER_SM // (shared + SHARED_RESERVED),
        "programs": min(MAX_PROGRAMS, MAX_WARPS // num_warps),
    }
    bound = min(bounds, key=bounds.__getitem__)
    return bounds[bound], bound


def base_opcodes(instructions: list[tuple[str, str]]) -> list[str]:
    """Each SASS instruction's opcode without its modifiers (``LDG.E.128`` -> ``LDG``)."""
    return [op.split(".")[0] for op, _ in instructions]


def mix(arm: Arm) -> dict:
    """The arm's instruction counts, per thread and per state element, and its resources."""
    sass = codegen.sass_of(arm.compiled.asm["cubin"])
    instructions = codegen.sass_functions(sass)[arm.kernel_name]
    bodies = loop_bodies(sass, arm.kernel_name)
    if len(bodies) > 1 or (arm.chunks > 1) != bool(bodies):
        raise ValueError(f"{arm.name}: loops {bodies} for {arm.chunks} blocks per program")
    for start, end in bodies:  # the loop over blocks of value rows runs once per block
        instructions = instructions + (arm.chunks - 1) * instructions[start:end]
    opcodes = collections.Counter(base_opcodes(instructions))
    elements = arm.chunks * arm.block_v * HEADS["K"] // (32 * arm.num_warps)
    usage = codegen.resource_usage(arm.compiled)
    classes = {name: sum(opcodes[o] for o in ops) for name, ops in CLASSES.items()}
    classes["other"] = len(instructions) - sum(classes.values())
    return {
        "arm": arm.name,
        "block_v": arm.block_v,
        "num_warps": arm.num_warps,
        "chunks": arm.chunks,
        "state_elements_per_thread": elements,
        "instructions": len(instructions),
        "instructions_per_element": round(len(instructions) / elements, 3),
        "per_element": {name: round(n / elements, 3) for name, n in classes.items()},
        "classes": classes,
        "top_opcodes": dict(opcodes.most_common(12)),
        "registers": usage.registers,
        "spills": usage.spills,
        "shared_bytes": usage.shared,
        "resident_warps_per_sm": resident_warps(usage.registers, arm.num_warps),
    }


def arms(
    vllm_source: Path, state_dtype: torch.dtype, batch: int, capability: int = 90
) -> list[Arm]:
    """Every arm for one state dtype and batch size."""
    compiled = [
        compile_vllm(vllm_source, state_dtype, batch, capability),
        compile_ours(state_dtype, batch, capability, fusion=False),
        compile_ours(state_dtype, batch, capability, fusion=True),
        compile_chunked(state_dtype, batch, capability),
    ]
    return compiled + [
        compile_what_if(state_dtype, batch, capability, fma=False),
        compile_what_if(state_dtype, batch, capability, fma=True),
    ]


def state_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]


def cases(vllm_source: Path, batches: tuple[int, ...], capability: int = 90) -> list[dict]:
    """mix() of every arm, state dtype and batch size, with each arm's instructions per
    element over vLLM's (``vs_vllm``; above 1.0 the arm issues more)."""
    results = []
    for state_dtype in (torch.float32, torch.bfloat16):
        for batch in batches:
            mixes = [mix(arm) for arm in arms(vllm_source, state_dtype, batch, capability)]
            reference = mixes[0]["instructions_per_element"]
            for entry in mixes:
                entry |= {
                    "state": state_name(state_dtype),
                    "batch": batch,
                    "vs_vllm": round(entry["instructions_per_element"] / reference, 3),
                }
                results.append(entry)
    return results


def candidate_counts(batch: int = 64, capability: int = 90) -> list[dict]:
    """mix() of the recurrent kernel at its default launch shape and at every shape
    ``bench_decode.py --sweep`` times (``launch_shapes.recurrent_candidates``), both state
    dtypes, each with its launch shape (``config``), whether it is the default and whether
    codegen's contraction check passes it."""
    results = []
    for state_dtype in (torch.float32, torch.bfloat16):
        dims = dims_for(batch)
        default = recurrent.recurrent_config(dims, state_dtype, interpreted=False)
        for config in [default, *launch_shapes.recurrent_candidates(dims, state_dtype)]:
            compiled = codegen.compile_recurrent(
                dims, state_dtype=state_dtype, capability=capability, config=config
            )
            arm = Arm(
                "ours" if config == default else "candidate",
                compiled,
                "recurrent_step_kernel",
                config.block_v,
                config.num_warps,
                config.chunks,
            )
            entry = mix(arm) | {
                "config": config.__dict__,
                "default": config == default,
                "contraction_clean": codegen.report_of(compiled).clean,
            }
            results.append(entry | {"state": state_name(state_dtype), "batch": batch})
    return results


def candidate_table(results: list[dict]) -> str:
    """A Markdown table of ``candidate_counts``, fewest instructions per element first."""
    lines = [
        "| state | block_v | log2 (J, lanes, vec) | warps | chunks | instr. / element "
        "| registers | warps / SM |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(results, key=lambda r: (r["state"], r["instructions_per_element"])):
        c = r["config"]
        lines.append(
            f"| {r['state']} | {c['block_v']} | ({c['log2_j']}, {c['log2_cl']}, {c['log2_vec']}) "
            f"| {c['num_warps']} | {c['chunks']} | {r['instructions_per_element']:.2f}"
            f"{' (default)' if r['default'] else ''} "
            f"| {r['registers']}{' (spills)' if r['spills'] else ''} "
            f"| {r['resident_warps_per_sm']} |"
        )
    return "\n".join(lines)


def table(results: list[dict]) -> str:
    """The Markdown table of docs/kernels.md."""
    lines = [
        "| state | B | arm | BV x warps (x blocks) | instr. / element | vs vLLM | fp32 ops "
        "| shuffles | registers | warps / SM |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['state']} | {r['batch']} | {r['arm']} | {r['block_v']} x {r['num_warps']}"
            f"{f' (x {chunks})' if (chunks := r.get('chunks', 1)) > 1 else ''} "
            f"| {r['instructions_per_element']:.2f} | {r['vs_vllm']:.2f} "
            f"| {r['per_element']['fp32_arithmetic']:.2f} | {r['per_element']['shuffles']:.2f} "
            f"| {r['registers']}{' (spills)' if r['spills'] else ''} "
            f"| {r['resident_warps_per_sm']} |"
        )
    return "\n".join(lines)


def loop_order(sass: str, kernel_name: str, ahead: tuple[str, ...]) -> dict | None:
    """Where the loop over blocks of ``kernel_name`` (its one loop; None without one) issues
    the ``ahead`` instructions (the loads of blocks to come) against its fp32 arithmetic and
    its global stores: first and last position of each in the loop's body, and ``place``: the
    share of the arithmetic issued before the first of them (``"after the stores"`` where they
    follow the arithmetic and the stores; None where the loop issues none)."""
    bodies = loop_bodies(sass, kernel_name)
    if len(bodies) != 1:
        return None
    (start, end), instructions = bodies[0], codegen.sass_functions(sass)[kernel_name]
    body = base_opcodes(instructions[start:end])

    def span(opcodes: tuple[str, ...]) -> list[int]:
        found = [i for i, op in enumerate(body) if op in opcodes]
        return [found[0], found[-1]] if found else []

    loads, arithmetic, stores = span(ahead), span(CLASSES["fp32_arithmetic"]), span(("STG",))
    if not loads:
        place = None
    elif loads[0] > max(arithmetic[1], stores[1]):
        place = "after the stores"
    else:
        issued = sum(op in CLASSES["fp32_arithmetic"] for op in body[: loads[0]])
        total = sum(op in CLASSES["fp32_arithmetic"] for op in body)
        place = f"after {round(100 * issued / total)} % of the arithmetic"
    return {
        "instructions": len(body),
        "ahead": loads,
        "arithmetic": arithmetic,
        "stores": stores,
        "place": place,
    }


def pipelined_counts(batch: int = 128, capability: int = 90) -> list[dict]:
    """Static counts of ``pipelined_kernel``'s variants (``pipelined_kernel.PIPELINED``) beside
    ours at the default shape and at each variant's shape, both state dtypes, at ``batch``:
    registers, shared memory per program (Triton's total, the pipeline's buffers included), the
    kernel's asynchronous copies (``LDGSTS``) and global loads (``LDG``) as written (a loop's body
    once), its instructions as written, and the warps per SM its registers, its shared memory and
    the limit of 32 programs allow, with which of them bounds it, and where the loop over blocks
    issues the loads of the blocks to come (``loop_order``: ours' plain loads of the next block,
    the variants' asynchronous copies). A control arm,
    ``launch_num_stages_4``, is the kernel with one stage compiled with the launch's
    ``num_stages=4``: Triton pipelines a loop without dots only where the loop asks."""
    dims = dims_for(batch)
    results = []
    for state_dtype in (torch.float32, torch.bfloat16):
        default = recurrent.recurrent_config(dims, state_dtype, interpreted=False)
        arms = [("ours", default, None, None)]
        for name, (fields, stages) in pipelined_kernel.PIPELINED.items():
            config = pipelined_kernel.variant_config(default, fields, HEADS["K"], state_dtype)
            if config.chunks < 2:
                continue  # one block per program: no loop to pipeline
            if ("ours", config, None, None) not in arms:
                arms.append(("ours", config, None, None))
            arms.append((name, config, stages, None))
        control = pipelined_kernel.variant_config(
            default, pipelined_kernel.SHAPES["w1c16"], HEADS["K"], state_dtype
        )
        arms.append(("launch_num_stages_4", control, 1, 4))
        for name, config, stages, num_stages in arms:
            if stages is None:
                compiled = codegen.compile_recurrent(
                    dims, state_dtype=state_dtype, capability=capability, config=config
                )
            else:
                compiled = pipelined_kernel.compile_pipelined(
                    HEADS,
                    config,
                    state_dtype,
                    stages,
                    batch=batch,
                    capability=capability,
                    num_stages=num_stages,
                )
            kernel_name = "recurrent_step_kernel" if stages is None else "pipelined_kernel"
            sass = codegen.sass_of(compiled.asm["cubin"])
            opcodes = collections.Counter(base_opcodes(codegen.sass_functions(sass)[kernel_name]))
            usage = codegen.resource_usage(compiled)
            shared = compiled.metadata.shared
            programs, bound = resident_programs(usage.registers, config.num_warps, shared)
            results.append(
                {
                    "arm": name,
                    "state": state_name(state_dtype),
                    "batch": batch,
                    "config": config.__dict__,
                    "default": config == default,
                    "stages": stages,
                    "launch_num_stages": num_stages,
                    "registers": usage.registers,
                    "spills": usage.spills,
                    "shared_bytes": shared,
                    "async_copies": opcodes["LDGSTS"],
                    "global_loads": opcodes["LDG"],
                    "instructions": sum(opcodes.values()),
                    "resident_warps_per_sm": programs * config.num_warps,
                    "occupancy_bound": bound,
                    "shared_kib_per_sm": round(programs * shared / 1024, 1),
                    "loop": loop_order(
                        sass, kernel_name, ("LDGSTS",) if (stages or 1) > 1 else ("LDG",)
                    ),
                }
            )
    return results


def pipelined_table(results: list[dict]) -> str:
    """A Markdown table of ``pipelined_counts``; warps per SM bounded by the shared memory or the
    program limit, not the registers, say so."""
    lines = [
        "| state | arm | BV x warps x blocks | log2 (J, lanes, vec) | stages | registers "
        "| warps / SM | shared / program (bytes) | LDGSTS | LDG | instructions "
        "| loads ahead, in the loop |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        c = r["config"]
        default_arm = r["stages"] is None
        bound = r["occupancy_bound"]
        stages = "-" if default_arm else str(r["stages"])
        if r["launch_num_stages"] is not None:
            stages += f" (launch {r['launch_num_stages']})"
        lines.append(
            f"| {r['state']} | {r['arm']}{' (default)' if r['default'] and default_arm else ''} "
            f"| {c['block_v']} x {c['num_warps']} x {c['chunks']} "
            f"| ({c['log2_j']}, {c['log2_cl']}, {c['log2_vec']}) | {stages} "
            f"| {r['registers']}{' (spills)' if r['spills'] else ''} "
            f"| {r['resident_warps_per_sm']}{'' if bound == 'registers' else f' ({bound})'} "
            f"| {r['shared_bytes']} | {r['async_copies']} "
            f"| {r['global_loads']} | {r['instructions']} "
            f"| {(r['loop'] or {}).get('place') or '-'} |"
        )
    return "\n".join(lines)
