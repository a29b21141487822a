"""A method replacement that records what it replaced and refuses to stack."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PATCH_ATTR = "__gdn_invariant_original__"


@dataclass(frozen=True)
class SourceTarget:
    """A function of vLLM, named by module and qualified name (``Class.method``)."""

    module: str
    qualname: str

    @property
    def key(self) -> str:
        return f"{self.module}:{self.qualname}"

    @property
    def path_in_package(self) -> str:
        """The module's file relative to site-packages, as it lies in a wheel."""
        return self.module.replace(".", "/") + ".py"

    def installed_source_file(self) -> Path | None:
        """The installed module file, found without importing the module."""
        try:
            spec = importlib.util.find_spec(self.module)
        except (ImportError, ValueError):
            return None
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            return None
        return Path(spec.origin)


class PatchError(RuntimeError):
    """A patch cannot be applied (target missing, or patched already by someone else)."""


def resolve(dotted: str) -> Any:
    """``"package.module:attr"`` -> the attribute."""
    module_name, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(module_name), attr)


@dataclass
class MethodPatch:
    """Replace ``target`` (a ``Class.method`` of a vLLM module) by ``replacement``.

    ``replacement`` is a ``"module:function"`` path, imported only when the patch is applied.
    ``keep_original_as`` names the class attribute that keeps vLLM's own method.
    ``relies_on`` names vLLM functions the replacement calls or whose behaviour it assumes;
    the version guard fingerprints them as well as the target.
    """

    target: SourceTarget
    replacement: str
    why: str
    keep_original_as: str | None = None
    relies_on: Sequence[SourceTarget] = ()
    original: Callable[..., Any] | None = field(default=None, init=False, repr=False)

    @property
    def name(self) -> str:
        return self.target.qualname

    @property
    def method_name(self) -> str:
        return self.target.qualname.rpartition(".")[2]

    def owner(self) -> type:
        owner: Any = importlib.import_module(self.target.module)
        for part in self.target.qualname.split(".")[:-1]:
            owner = getattr(owner, part, None)
            if owner is None:
                raise PatchError(f"{self.target.key}: {part} not found")
        return owner

    def current(self) -> Callable[..., Any]:
        try:
            return self.owner().__dict__[self.method_name]
        except KeyError:
            raise PatchError(f"{self.target.key} not found") from None

    def check_unpatched(self) -> None:
        """Raise unless the live method is the function defined in vLLM's own file."""
        current = self.current()
        if getattr(current, PATCH_ATTR, None) is not None:
            raise PatchError(f"{self.target.key} is already patched")
        code = getattr(current, "__code__", None)
        path = self.target.installed_source_file()
        if (
            code is None
            or path is None
            or os.path.realpath(code.co_filename) != os.path.realpath(path)
        ):
            raise PatchError(
                f"{self.target.key} is not vLLM's own function (replaced by another plugin?)"
            )

    def apply(self) -> None:
        self.check_unpatched()
        owner = self.owner()
        original = self.current()
        function = resolve(self.replacement)

        def replacement(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)

        replacement.__name__ = self.method_name
        replacement.__qualname__ = self.target.qualname
        replacement.__doc__ = function.__doc__
        replacement.__wrapped__ = function  # type: ignore[attr-defined]
        setattr(replacement, PATCH_ATTR, original)
        if self.keep_original_as is not None:
            setattr(owner, self.keep_original_as, original)
        setattr(owner, self.method_name, replacement)
        self.original = original

    def revert(self) -> None:
        if self.original is None:
            return
        owner = self.owner()
        setattr(owner, self.method_name, self.original)
        if self.keep_original_as is not None and self.keep_original_as in owner.__dict__:
            delattr(owner, self.keep_original_as)
        self.original = None

    @property
    def applied(self) -> bool:
        return self.original is not None


def apply_all(patches: Sequence[MethodPatch]) -> None:
    """Apply every patch or none: a failure reverts the ones already applied."""
    for patch in patches:
        patch.check_unpatched()
    done: list[MethodPatch] = []
    try:
        for patch in patches:
            patch.apply()
            done.append(patch)
    except BaseException:
        for patch in reversed(done):
            patch.revert()
        raise


@contextlib.contextmanager
def applied(patches: Sequence[MethodPatch]) -> Iterator[None]:
    """The patches applied (all or none) for the duration of the block, reverted after it in
    reverse order."""
    apply_all(patches)
    try:
        yield
    finally:
        for patch in reversed(patches):
            patch.revert()
