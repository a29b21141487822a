"""What the batch-invariance patches share: the mode switch, the model test, the patch class.

* :func:`batch_invariant_enabled` reads ``VLLM_BATCH_INVARIANT`` with the expression vLLM's
  ``vllm.envs`` uses in every supported release (``bool(int(os.getenv(..., "0")))``).
* :func:`is_qwen_gdn_model` tells Qwen3-Next / Qwen3.5 (GDN layers of
  ``QwenGatedDeltaNetAttention``) from every other model, by the Hugging Face model type.
* :class:`AttributePatch` replaces what :class:`~vllm_gdn_invariant.patches.base.MethodPatch`
  cannot: a module-level function, a classmethod, a function bound under its name in a second
  module, or a kernel object. Its replacement is a factory that receives vLLM's original.

This module imports nothing from vLLM.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_gdn_invariant.patches.base import PATCH_ATTR, MethodPatch, PatchError, resolve

BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"
# The chunk size of the GDN prefill kernels: FLA's FLA_CHUNK_SIZE and FlashInfer's GDN chunk.
CHUNK_GRID = 64
QWEN_GDN_MODEL_TYPES = frozenset(
    {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}
)
COVERAGE = (
    "the gdn_invariant plugin declares batch invariance for Qwen GDN layers only "
    "(QwenGatedDeltaNetAttention: Qwen3-Next, Qwen3.5)"
)


class BatchInvarianceConfigError(ValueError):
    """A configuration that batch-invariant mode cannot serve bit-exactly for a Qwen GDN model."""


def batch_invariant_enabled(environ: dict[str, str] | None = None) -> bool:
    """``VLLM_BATCH_INVARIANT`` as vLLM reads it (0.26-0.34): ``bool(int(value or "0"))``.

    A value ``int`` cannot parse raises ``ValueError``, as vLLM does when it reads it.
    """
    env = os.environ if environ is None else environ
    value = env.get(BATCH_INVARIANT_ENV, "0")
    try:
        return bool(int(value))
    except ValueError:
        raise ValueError(
            f"{BATCH_INVARIANT_ENV}={value!r} is not an integer (vLLM reads it as bool(int(...)))"
        ) from None


def is_qwen_gdn_model(model_config: Any) -> bool:
    """Whether vLLM's ``ModelConfig`` is a Qwen3-Next / Qwen3.5 model (text or multimodal)."""
    for name in ("hf_text_config", "hf_config"):
        config = getattr(model_config, name, None)
        if getattr(config, "model_type", None) in QWEN_GDN_MODEL_TYPES:
            return True
    return False


def _function_of(value: Any) -> Any:
    """The Python function behind an attribute: itself, a classmethod's, a Triton kernel's
    (through autotuner and heuristics wrappers)."""
    if isinstance(value, (classmethod, staticmethod)):
        return value.__func__
    while value is not None and not hasattr(value, "__code__"):
        value = getattr(value, "fn", None)
    return value


@dataclass
class AttributePatch(MethodPatch):
    """Replace the attribute ``target`` names, or the same function bound in ``owner_module``.

    ``replacement`` is a ``"module:factory"`` path; the factory receives vLLM's original (the
    function, or for ``kind="object"`` the object) and returns what takes its place.
    ``kind``: ``"function"`` (module function or method), ``"classmethod"``, ``"object"``.
    ``owner_module``: the module whose name is replaced when it is not the defining one (a
    ``from ... import name`` binding); the target stays the defining function, which is what
    the guard fingerprints. ``label`` is the patch's name in the plugin's log line.
    """

    kind: str = "function"
    owner_module: str | None = None
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or self.target.qualname

    @property
    def method_name(self) -> str:
        return self.target.qualname.rpartition(".")[2]

    def owner(self) -> Any:
        if self.owner_module is None:
            return super().owner()
        return importlib.import_module(self.owner_module)

    def current(self) -> Any:
        try:
            return vars(self.owner())[self.method_name]
        except KeyError:
            where = self.owner_module or self.target.module
            raise PatchError(f"{where}:{self.method_name} not found") from None

    def check_unpatched(self) -> None:
        """Raise unless the live attribute is vLLM's own function, defined in ``target``'s file."""
        current = self.current()
        function = _function_of(current)
        if getattr(current, PATCH_ATTR, None) is not None or (
            function is not None and getattr(function, PATCH_ATTR, None) is not None
        ):
            raise PatchError(f"{self.target.key} is already patched")
        code = getattr(function, "__code__", None)
        path = self.target.installed_source_file()
        if (
            code is None
            or path is None
            or code.co_name != self.method_name
            or os.path.realpath(code.co_filename) != os.path.realpath(path)
        ):
            raise PatchError(
                f"{self.target.key} is not vLLM's own function (replaced by another plugin?)"
            )
        if self.kind == "classmethod" and not isinstance(current, classmethod):
            raise PatchError(f"{self.target.key} is not a classmethod")

    def apply(self) -> None:
        self.check_unpatched()
        owner = self.owner()
        original = self.current()
        factory: Callable[[Any], Any] = resolve(self.replacement)
        if self.kind == "object":
            new = factory(original)
            setattr(new, PATCH_ATTR, original)
        else:
            function = factory(_function_of(original))
            function.__name__ = self.method_name
            function.__qualname__ = self.target.qualname
            setattr(function, PATCH_ATTR, original)
            new = classmethod(function) if self.kind == "classmethod" else function
        setattr(owner, self.method_name, new)
        self.original = original

    def revert(self) -> None:
        if self.original is None:
            return
        setattr(self.owner(), self.method_name, self.original)
        self.original = None


@dataclass
class BatchInvariancePatch(AttributePatch):
    """An :class:`AttributePatch` installed for ``VLLM_BATCH_INVARIANT=1`` (named by its label
    after ``VLLM_BATCH_INVARIANT=1:`` in the plugin's log line)."""
