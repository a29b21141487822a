"""Drive vLLM's real ``QwenGatedDeltaNetAttention._forward_core`` outside an engine.

A layer object of vLLM's class (no weights loaded, no ``__init__``) with synthetic
parameters and caches, and attention metadata from vLLM's real ``GDNAttentionMetadataBuilder``
for any composition of decode rows and prefills. Used by the GPU evidence scripts, the GPU
tests, and (with the kernels replaced by the goldens) the CPU routing tests.

Request ``i`` of a step owns state block ``i + 1``; decode rows come first, as vLLM's
scheduler orders them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import types
from collections.abc import Sequence
from dataclasses import dataclass
from unittest import mock

import torch

from vllm_gdn_invariant.models.tiny import TINY_QWEN3_NEXT

from .scratch import scratch_folder

PREFIX = "model.layers.0.linear_attn"
BLOCK_SIZE = 16
CONTEXT_OF_DECODES = 63
CONTEXT_OF_CONTINUED_PREFILLS = 50


@dataclass(frozen=True)
class LayerDims:
    num_k_heads: int = 16
    num_v_heads: int = 32
    head_k_dim: int = 128
    head_v_dim: int = 128
    conv_width: int = 4

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim


QWEN3_NEXT_DIMS = LayerDims(16, 32)
QWEN3_NEXT_TP4_DIMS = LayerDims(4, 8)  # per rank at tensor parallel 4
LAYOUTS = {"tp1": QWEN3_NEXT_DIMS, "tp4": QWEN3_NEXT_TP4_DIMS}  # Qwen3-Next's, by TP layout
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # recurrent state, by name


@dataclass(frozen=True)
class Request:
    """One request of a step: ``query_len`` new tokens after ``context`` computed ones."""

    query_len: int
    context: int
    prefilling: bool

    @property
    def seq_len(self) -> int:
        return self.query_len + self.context


def step_requests(
    num_decodes: int, prefill_lens: Sequence[int], fresh: bool, context: int | None = None
) -> list[Request]:
    """Decode rows first, then prefills (fresh: no context; else a continued chunk after
    ``context`` tokens, default ``CONTEXT_OF_CONTINUED_PREFILLS``)."""
    if fresh:
        context = 0
    elif context is None:
        context = CONTEXT_OF_CONTINUED_PREFILLS
    return [Request(1, CONTEXT_OF_DECODES, False)] * num_decodes + [
        Request(n, context, True) for n in prefill_lens
    ]


def make_vllm_config(
    dims: LayerDims,
    state_dtype: torch.dtype,
    *,
    max_num_seqs: int = 512,
    max_num_batched_tokens: int = 16384,
    prefill_backend: str = "triton",
    align_block_size: int | None = None,
):
    """A VllmConfig for a tiny Qwen3-Next whose GDN layers have ``dims``.

    ``align_block_size``: prefix caching on, ``mamba_cache_mode="align"`` with mamba blocks,
    hash blocks and cache-hit alignment of that many tokens, as vLLM sets them for a hybrid
    model (the engine fills the last two in when it sizes the KV cache; here they are set).
    """
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    folder = scratch_folder("gdn_harness_")
    max_len = 32768
    config = {
        **TINY_QWEN3_NEXT,
        "linear_conv_kernel_dim": dims.conv_width,
        "linear_key_head_dim": dims.head_k_dim,
        "linear_value_head_dim": dims.head_v_dim,
        "linear_num_key_heads": dims.num_k_heads,
        "linear_num_value_heads": dims.num_v_heads,
        "max_position_embeddings": max_len,
    }
    (folder / "config.json").write_text(json.dumps(config))
    model_config = ModelConfig(
        model=str(folder), dtype="bfloat16", skip_tokenizer_init=True, max_model_len=max_len
    )
    cache_fields = dict(
        block_size=BLOCK_SIZE,
        mamba_ssm_cache_dtype=str(state_dtype).removeprefix("torch."),
        enable_prefix_caching=False,
    )
    if align_block_size is not None:
        cache_fields.update(
            block_size=align_block_size,
            enable_prefix_caching=True,
            mamba_cache_mode="align",
            mamba_block_size=align_block_size,
        )
    cache_config = CacheConfig(**cache_fields)
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_len,
        is_encoder_decoder=False,
    )
    vllm_config = VllmConfig(
        model_config=model_config, cache_config=cache_config, scheduler_config=scheduler_config
    )
    vllm_config.additional_config = {"gdn_prefill_backend": prefill_backend}
    if align_block_size is not None:
        cache = vllm_config.cache_config
        cache.enable_prefix_caching = True
        cache.mamba_cache_mode = "align"
        cache.mamba_block_size = align_block_size
        for name in ("hash_block_size", "cache_hit_alignment_tokens"):
            if hasattr(cache, name):
                setattr(cache, name, align_block_size)
    return vllm_config


def align_mode(vllm_config) -> bool:
    return getattr(vllm_config.cache_config, "mamba_cache_mode", "none") == "align"


def align_block_table(requests: Sequence[Request], block_size: int) -> list[list[int]]:
    """One block-table row per request in align mode: distinct blocks, numbered from 1."""
    width = max(-(-r.seq_len // block_size) for r in requests)
    return [[1 + i * width + col for col in range(width)] for i in range(len(requests))]


def exports_checkpoints(vllm_config, prefill_backend: str) -> bool:
    """Whether vLLM's Qwen GDN layer exports prefill checkpoints (0.33+: align + FlashInfer)."""
    from vllm.v1.kv_cache_interface import MambaSpec

    names = {f.name for f in dataclasses.fields(MambaSpec)}
    return (
        align_mode(vllm_config)
        and prefill_backend == "flashinfer"
        and "prefill_checkpoint_alignment" in names
    )


def mamba_spec(vllm_config, prefill_backend: str = "triton"):
    """The layer's MambaSpec as vLLM's KV cache manager builds it for this configuration."""
    from vllm.v1.kv_cache_interface import MambaSpec

    names = {f.name for f in dataclasses.fields(MambaSpec)}
    fields = dict(block_size=BLOCK_SIZE, shapes=((16, 64),), dtypes=(torch.float16,))
    if align_mode(vllm_config):
        fields["block_size"] = vllm_config.cache_config.mamba_block_size
        if "mamba_cache_mode" in names:
            fields["mamba_cache_mode"] = "align"
        if exports_checkpoints(vllm_config, prefill_backend):
            fields.update(
                num_prefill_checkpoint_blocks=1,
                prefill_checkpoint_alignment=vllm_config.cache_config.mamba_block_size,
            )
    return MambaSpec(**fields)


def common_metadata(
    requests: Sequence[Request],
    device: torch.device,
    blocks: Sequence[int] | Sequence[Sequence[int]] | None = None,
):
    """vLLM's CommonAttentionMetadata for ``requests``; request ``i`` owns ``blocks[i]`` (a
    block id, or a block-table row in align mode)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    query_lens = [r.query_len for r in requests]
    seq_lens = [r.seq_len for r in requests]
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    n = len(requests)
    blocks = list(range(1, n + 1)) if blocks is None else list(blocks)
    names = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
    extra = {}
    if "seq_lens_cpu_upper_bound" in names:
        extra["seq_lens_cpu_upper_bound"] = torch.tensor(seq_lens, dtype=torch.int32)
    if "is_prefilling" in names:
        extra["is_prefilling"] = torch.tensor([r.prefilling for r in requests])
    return CommonAttentionMetadata(
        **extra,
        query_start_loc=qsl.to(device),
        query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        num_reqs=n,
        num_actual_tokens=int(qsl[-1]),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=torch.tensor(blocks, dtype=torch.int32, device=device).reshape(n, -1),
        slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64, device=device),
    )


def build_metadata(
    vllm_config,
    requests: Sequence[Request],
    device: torch.device,
    blocks: Sequence[int] | Sequence[Sequence[int]] | None = None,
    prefill_backend: str = "triton",
):
    """GDN attention metadata for ``requests`` from vLLM's own builder.

    In align mode ``blocks`` defaults to :func:`align_block_table`.
    """
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    spec = mamba_spec(vllm_config, prefill_backend)
    if blocks is None and align_mode(vllm_config):
        blocks = align_block_table(requests, spec.block_size)
    with set_current_vllm_config(vllm_config):
        builder = GDNAttentionMetadataBuilder(
            kv_cache_spec=spec, layer_names=[PREFIX], vllm_config=vllm_config, device=device
        )
        return builder.build(
            common_prefix_len=0, common_attn_metadata=common_metadata(requests, device, blocks)
        )


@dataclass
class LayerState:
    """Parameters and caches of one synthetic GDN layer."""

    A_log: torch.Tensor
    dt_bias: torch.Tensor
    conv_weight: torch.Tensor  # [conv_dim, 1, W], as vLLM stores it
    conv_state: torch.Tensor  # vLLM's cache layout
    ssm_state: torch.Tensor  # [blocks, HV, V, K]

    def clone(self) -> LayerState:
        return LayerState(*(t.clone() for t in dataclasses.astuple(self)))


def make_layer_state(
    dims: LayerDims,
    state_dtype: torch.dtype,
    num_blocks: int,
    device: torch.device,
    generator: torch.Generator,
) -> LayerState:
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator

    conv_shape, ssm_shape = MambaStateShapeCalculator.gated_delta_net_state_shape(
        1,
        dims.num_k_heads,
        dims.num_v_heads,
        dims.head_k_dim,
        dims.head_v_dim,
        dims.conv_width,
        0,
    )

    def randn(*shape, dtype=torch.float32, scale=1.0):
        t = torch.randn(*shape, generator=generator, dtype=torch.float32) * scale
        return t.to(dtype=dtype, device=device)

    return LayerState(
        A_log=randn(dims.num_v_heads, scale=0.5),
        dt_bias=randn(dims.num_v_heads, dtype=torch.bfloat16, scale=0.5),  # model dtype, as vLLM
        conv_weight=randn(dims.conv_dim, 1, dims.conv_width, dtype=torch.bfloat16, scale=0.3),
        conv_state=randn(num_blocks, *conv_shape, dtype=torch.bfloat16, scale=0.3),
        ssm_state=randn(num_blocks, *ssm_shape, dtype=state_dtype, scale=0.05),
    )


def step_inputs(
    dims: LayerDims, num_tokens: int, device: torch.device, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mixed_qkv, b, a) for ``num_tokens`` rows, bf16."""

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(torch.bfloat16).to(device)

    return (
        randn(num_tokens, dims.conv_dim),
        randn(num_tokens, dims.num_v_heads),
        randn(num_tokens, dims.num_v_heads),
    )


def make_layer(vllm_config, dims: LayerDims, state: LayerState, *, gqa_interleaved_layout: bool):
    """A ``QwenGatedDeltaNetAttention`` over ``state`` (its caches are used in place)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen

    layer = object.__new__(qwen.QwenGatedDeltaNetAttention)
    torch.nn.Module.__init__(layer)
    attrs = dict(
        prefix=PREFIX,
        enable_packed_recurrent_decode=True,
        tp_size=1,
        num_k_heads=dims.num_k_heads,
        num_v_heads=dims.num_v_heads,
        head_k_dim=dims.head_k_dim,
        head_v_dim=dims.head_v_dim,
        key_dim=dims.num_k_heads * dims.head_k_dim,
        value_dim=dims.num_v_heads * dims.head_v_dim,
        activation="silu",
        gqa_interleaved_layout=gqa_interleaved_layout,
        qkvz_layout="interleaved" if gqa_interleaved_layout else "flat",
        conv1d=types.SimpleNamespace(weight=state.conv_weight, bias=None),
        kv_cache=(state.conv_state, state.ssm_state),
        _prefill_kernels_warmed_up=True,
    )
    for name, value in attrs.items():
        object.__setattr__(layer, name, value)
    object.__setattr__(layer, "A_log", state.A_log)
    object.__setattr__(layer, "dt_bias", state.dt_bias)
    with set_current_vllm_config(vllm_config):
        chunk = qwen.ChunkGatedDeltaRule()
    object.__setattr__(layer, "chunk_gated_delta_rule", chunk)
    object.__setattr__(layer, "gdn_prefill_backend", chunk.gdn_prefill_backend)
    if exports_checkpoints(vllm_config, chunk.gdn_prefill_backend):
        add_checkpoint_export(layer, vllm_config, dims, state.ssm_state.device)
    return layer


def add_checkpoint_export(layer, vllm_config, dims: LayerDims, device: torch.device) -> None:
    """What vLLM's layer ``__init__`` sets up when it exports prefill checkpoints (align mode
    with FlashInfer prefill, 0.33+), and the workspace its checkpoint buffer comes from."""
    from vllm.model_executor.layers.mamba.checkpoint import MambaPrefillCheckpointExporter
    from vllm.v1.worker import workspace

    max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
    grid = vllm_config.cache_config.mamba_block_size
    for name, value in dict(
        vllm_config=vllm_config,
        conv_kernel_size=dims.conv_width,
        _checkpoint_alignment=grid,
        _max_num_batched_tokens=max_tokens,
        _checkpoint_exporter=MambaPrefillCheckpointExporter(state_len=dims.conv_width - 1),
    ).items():
        object.__setattr__(layer, name, value)
    # A cached_property of vLLM's layer, read from the same quantities.
    layer.__dict__["_checkpoint_buffer_spec"] = (
        (-(-max_tokens // grid), dims.num_v_heads, dims.head_v_dim, dims.head_k_dim),
        torch.float32,
    )
    try:
        workspace.current_workspace_manager()
    except AssertionError:  # not initialized in this process yet (the model runner does it)
        workspace.init_workspace_manager(device)


@contextlib.contextmanager
def patched_forward_context(vllm_config, attn_metadata: dict):
    """vLLM's current config set, and ``get_forward_context()`` answering ``attn_metadata``."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen

    from vllm_gdn_invariant.patches import routed_forward_core

    context = types.SimpleNamespace(attn_metadata=attn_metadata)
    with contextlib.ExitStack() as stack:
        stack.enter_context(set_current_vllm_config(vllm_config))
        for module in (qwen, routed_forward_core):
            stack.enter_context(
                mock.patch.object(module, "get_forward_context", return_value=context)
            )
        yield context


def run_core(
    layer,
    vllm_config,
    attn_metadata,
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    *,
    method: str = "_forward_core",
) -> torch.Tensor:
    """Run ``layer.<method>`` on one step; return ``core_attn_out`` (poisoned with NaN first)."""
    out = torch.full(
        (mixed_qkv.shape[0], layer.num_v_heads, layer.head_v_dim),
        float("nan"),
        dtype=torch.bfloat16,
        device=mixed_qkv.device,
    )
    with patched_forward_context(vllm_config, {PREFIX: attn_metadata}):
        getattr(layer, method)(
            mixed_qkv=mixed_qkv.clone(), b=b.clone(), a=a.clone(), core_attn_out=out
        )
    return out
