"""The autotuned FLA chunk-prefill kernels run one fixed config under batch-invariant mode.

The pin's rule, its copy of the autotuner (vLLM's kept as it is), a forced autotune outcome
that moves an unpinned toy kernel's bits and not the pinned one's (Triton's interpreter on
CPU), and the pin list against every autotuned kernel of the installed vLLM's FLA ops.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

from vllm_gdn_invariant.patches.bi_autotune import (
    AUTOTUNED_KERNELS,
    FLA_OPS,
    find_autotuner,
    pin,
    pinned_config,
)
from vllm_gdn_invariant.shadow.bits import same_bits

from ..kernels.conftest import import_interpreted

triton = pytest.importorskip("triton")
PROBE = Path(__file__).with_name("autotune_probe.py")
NOT_ON_THE_QWEN_PATH = {"kda"}  # Kimi's delta attention


def config(warps, stages, **tiles):
    return triton.Config(tiles, num_warps=warps, num_stages=stages)


@pytest.mark.parametrize(
    "configs, expected",
    [
        ([config(2, 3, BV=32), config(4, 2, BV=32), config(4, 2, BV=64)], 2),
        ([config(1, 2), config(2, 2), config(8, 2)], 1),  # ties on warps: the list's order
        ([config(4, 3, BK=64, BV=64), config(4, 4, BK=128)], 0),  # stages before tiles
        ([config(4, 2, BK=64, BV=128), config(4, 2, BK=128, BV=128)], 1),  # then the most
        ([config(4, 2, BK=32), config(8, 2, BK=128), config(4, 2, BK=128)], 2),
    ],
)
def test_the_pinned_config_follows_the_rule(configs, expected):
    assert pinned_config(configs) is configs[expected]


@pytest.fixture(scope="module")
def probe():
    return import_interpreted("gdn_invariant_autotune_probe_interpreted", PROBE)


def test_pin_copies_the_autotuner_and_leaves_vllms_as_it_was(probe):
    kernel = probe.tile_sum_kernel
    tuner = find_autotuner(kernel)
    configs = list(tuner.configs)
    pinned = pin(kernel)
    assert pinned is not kernel and find_autotuner(pinned) is not tuner
    assert find_autotuner(pinned).configs == [pinned_config(configs)]
    assert tuner.configs == configs  # vLLM's object untouched
    assert pinned.fn.fn is tuner.fn  # the same compiled function underneath


def launch_forcing(kernel, monkeypatch, winner: int, x):
    """Launch ``kernel`` with its autotuner's timings rigged so that config ``winner`` wins."""
    tuner = find_autotuner(kernel)
    names = [str(c) for c in tuner.configs]
    monkeypatch.setattr(
        type(tuner),
        "_bench",
        lambda self, *a, config, **k: [1.0 if str(config) == names[winner] else 9.0] * 3,
    )
    tuner.cache.clear()
    out = torch.zeros(1, dtype=torch.float32)
    kernel[(1,)](x, out, x.numel())
    return out


def test_a_forced_autotune_outcome_moves_unpinned_bits_and_not_pinned_ones(probe, monkeypatch):
    x = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    kernel = probe.tile_sum_kernel
    unpinned = [launch_forcing(kernel, monkeypatch, w, x) for w in range(3)]
    # Negative control: which config wins changes the sum's bits.
    assert not all(same_bits(unpinned[0], other) for other in unpinned[1:])
    pinned = pin(kernel)
    outs = [launch_forcing(pinned, monkeypatch, w, x) for w in range(3)]
    assert all(same_bits(outs[0], other) for other in outs[1:])
    expected = find_autotuner(kernel).configs.index(pinned_config(find_autotuner(kernel).configs))
    assert same_bits(outs[0], unpinned[expected])


def autotuned_in(folder: Path) -> set[tuple[str, str]]:
    found = set()
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(
                "autotune" in ast.unparse(d) for d in node.decorator_list
            ):
                found.add((path.stem, node.name))
    return found


def test_every_autotuned_kernel_of_vllms_fla_prefill_is_pinned():
    spec = importlib.util.find_spec(FLA_OPS)
    folder = Path(spec.origin).parent
    found = {k for k in autotuned_in(folder) if k[0] not in NOT_ON_THE_QWEN_PATH}
    assert found == set(AUTOTUNED_KERNELS)
