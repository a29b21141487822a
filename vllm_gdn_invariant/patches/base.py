"""The patch mechanism: one declarative :class:`Patch`, applied all or nothing.

A :class:`Patch` names the vLLM function it changes (:class:`SourceTarget`, which the version
guard fingerprints together with everything in ``relies_on``) and a factory that makes what
takes its place. :func:`apply_all` installs a list of them atomically:

1. every patch is checked (the target exists and is vLLM's own function, or for a wrapper
   vLLM's function under this plugin's own patches); nothing is changed yet;
2. each distinct ``prepare`` (process setup a replacement needs) runs once; nothing of vLLM
   is changed yet;
3. the patches are installed in order; each attribute is logged before it is set, so that
   any failure (in a factory, a setattr, a later patch) restores every attribute touched, in
   reverse order, to the object it held.

What a patch installs carries ``__gdn_invariant_original__`` (what it replaced) and
``__gdn_invariant_patch__`` (the patch's name), so a patch chain can be followed down to
vLLM's function (:func:`vllm_own`) and nothing is patched twice.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

PATCH_ATTR = "__gdn_invariant_original__"
NAME_ATTR = "__gdn_invariant_patch__"

Kind = Literal["function", "classmethod", "object"]
KINDS: tuple[str, ...] = ("function", "classmethod", "object")

_MISSING = object()


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
    """A patch cannot be applied (target missing, not vLLM's own, or patched already)."""


def function_of(value: Any) -> Any:
    """The Python function behind an attribute: itself, a classmethod's or staticmethod's, a
    Triton kernel's (``.fn``, through autotuner and heuristics wrappers); None when there is
    none."""
    if isinstance(value, (classmethod, staticmethod)):
        return value.__func__
    while value is not None and not hasattr(value, "__code__"):
        value = getattr(value, "fn", None)
    return value


def replaced_by_patch(value: Any) -> Any:
    """What this plugin's patch ``value`` replaced; None when ``value`` is no such patch."""
    found = getattr(value, PATCH_ATTR, None)
    if found is None:
        function = function_of(value)
        found = None if function is None else getattr(function, PATCH_ATTR, None)
    return found


def vllm_own(value: Any) -> Any:
    """The object at the bottom of this plugin's patch chain (vLLM's, when patched by us)."""
    while (below := replaced_by_patch(value)) is not None:
        value = below
    return value


def is_vllm_own(value: Any, target: SourceTarget) -> bool:
    """Whether ``value``'s function is ``target``'s: its name, defined in the installed file
    of ``target``'s module."""
    code = getattr(function_of(value), "__code__", None)
    path = target.installed_source_file()
    return (
        code is not None
        and path is not None
        and code.co_name == target.qualname.rpartition(".")[2]
        and os.path.realpath(code.co_filename) == os.path.realpath(path)
    )


def set_attribute(owner: Any, name: str, value: Any) -> None:
    """The one place a patch sets an attribute of vLLM (a class or a module)."""
    setattr(owner, name, value)


def restore_attribute(owner: Any, name: str, previous: Any) -> None:
    """Put back what ``owner.name`` held before a patch set it (nothing: remove it)."""
    if previous is _MISSING:
        if name in vars(owner):
            delattr(owner, name)
    else:
        setattr(owner, name, previous)


def _fresh_function(function: Any, name: str, qualname: str) -> types.FunctionType:
    """A copy of ``function`` to install under ``name`` (so marking it never touches the
    factory's function, which may be a module-level one)."""
    if not isinstance(function, types.FunctionType):
        raise PatchError(f"{qualname}: the replacement is not a function ({function!r})")
    copy = types.FunctionType(
        function.__code__, function.__globals__, name, function.__defaults__, function.__closure__
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__dict__.update(function.__dict__)
    copy.__doc__ = function.__doc__
    copy.__module__ = function.__module__
    copy.__annotations__ = function.__annotations__
    copy.__qualname__ = qualname
    copy.__wrapped__ = function  # type: ignore[attr-defined]
    return copy


@dataclass(eq=False)
class Patch:
    """One change to vLLM: the attribute ``target`` names takes what ``replacement`` makes.

    * ``target``: the vLLM function changed (a module function, ``Class.method`` or a
      classmethod, or a Triton kernel object); the guard fingerprints its source.
    * ``replacement``: a factory, called when the patch is installed with what the attribute
      holds (vLLM's function; a classmethod's function; the object for ``kind="object"``; for
      a wrapper, the function it goes over) and returning what takes its place (a function,
      installed as a copy under the target's name; an object for ``kind="object"``). Patch
      modules import nothing from vLLM: a factory that needs vLLM imports inside.
    * ``why``: one line. ``relies_on``: vLLM functions the replacement calls or whose
      behaviour it assumes; the guard fingerprints them too.
    * ``kind``: ``"function"``, ``"classmethod"`` (installed as a classmethod) or
      ``"object"``.
    * ``binding``: the module whose global name is replaced when it is not the defining one
      (a ``from ... import name`` binding); the target stays the defining function, which
      is what the guard fingerprints.
    * ``keep_original_as``: a class attribute that keeps vLLM's own method for the
      replacement to call.
    * ``wraps``: the replacement goes over whatever is installed (vLLM's function or this
      plugin's patches of it) and calls it; without it the target must be vLLM's own.
    * ``prepare``: process setup the replacement needs, run before anything is installed.
    * ``label``: the name in the plugin's log line (default: the target's qualname);
      ``group``: the heading it is listed under there ("": the first list).
    * ``since``: the first vLLM release it applies to (None: every supported release).

    One object per application: it records what it changed, for :meth:`revert`.
    """

    target: SourceTarget
    replacement: Callable[[Any], Any]
    why: str
    relies_on: Sequence[SourceTarget] = ()
    kind: Kind = "function"
    binding: str | None = None
    keep_original_as: str | None = None
    wraps: bool = False
    prepare: Callable[[], None] | None = None
    label: str = ""
    group: str = ""
    since: str | None = None
    _changes: list[tuple[Any, str, Any]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind {self.kind!r} is not one of {KINDS}")
        if self.binding is not None and "." in self.target.qualname:
            raise ValueError("a binding replaces a module-level name")

    @property
    def name(self) -> str:
        return self.label or self.target.qualname

    @property
    def attribute(self) -> str:
        return self.target.qualname.rpartition(".")[2]

    @property
    def where(self) -> str:
        """The replaced name, as ``module:qualname``."""
        if self.binding is None:
            return self.target.key
        return f"{self.binding}:{self.attribute}"

    def owner(self) -> Any:
        """The class or module whose attribute is replaced (imports vLLM's module)."""
        if self.binding is not None:
            return importlib.import_module(self.binding)
        owner: Any = importlib.import_module(self.target.module)
        for part in self.target.qualname.split(".")[:-1]:
            owner = vars(owner).get(part)
            if owner is None:
                raise PatchError(f"{self.target.key}: {part} not found")
        return owner

    def current(self) -> Any:
        """What the attribute holds now."""
        try:
            return vars(self.owner())[self.attribute]
        except KeyError:
            raise PatchError(f"{self.where} not found") from None

    def check(self) -> None:
        """Raise :class:`PatchError` unless the patch can be installed now; changes nothing."""
        if self._changes:
            raise PatchError(f"{self.name}: this patch object is applied already")
        live = self.current()
        if self.wraps:
            value = live
            while (below := replaced_by_patch(value)) is not None:
                if getattr(value, NAME_ATTR, None) == self.name:
                    raise PatchError(f"{self.where} is already wrapped by {self.name}")
                value = below
        elif replaced_by_patch(live) is not None:
            raise PatchError(f"{self.where} is already patched")
        else:
            value = live
        if not is_vllm_own(value, self.target):
            raise PatchError(
                f"{self.where} is not vLLM's own function (replaced by another plugin?)"
            )
        if self.kind == "classmethod" and not isinstance(live, classmethod):
            raise PatchError(f"{self.where} is not a classmethod")

    def build(self, live: Any) -> Any:
        """What to install over ``live``, marked; calls the factory, changes nothing."""
        if self.kind == "object":
            new = self.replacement(live)
            setattr(new, PATCH_ATTR, live)
            setattr(new, NAME_ATTR, self.name)
            return new
        function = self.replacement(live.__func__ if self.kind == "classmethod" else live)
        new = _fresh_function(function, self.attribute, self.target.qualname)
        setattr(new, PATCH_ATTR, live)
        setattr(new, NAME_ATTR, self.name)
        return classmethod(new) if self.kind == "classmethod" else new

    def install(self) -> None:
        """Check, build and set the attribute(s); each change is logged before it is made.

        On a failure the changes already made stay logged: :func:`apply_all` reverts them.
        Use :func:`apply_all` (or :meth:`apply`), which runs ``prepare`` first.
        """
        self.check()
        owner = self.owner()
        live = self.current()
        new = self.build(live)
        if self.keep_original_as is not None:
            self._set(owner, self.keep_original_as, live)
        self._set(owner, self.attribute, new)

    def _set(self, owner: Any, name: str, value: Any) -> None:
        self._changes.append((owner, name, vars(owner).get(name, _MISSING)))
        set_attribute(owner, name, value)

    def apply(self) -> None:
        """This patch alone, all or nothing (:func:`apply_all`)."""
        apply_all([self])

    def revert(self) -> None:
        """Put back, in reverse order, everything this patch changed."""
        while self._changes:
            owner, name, previous = self._changes.pop()
            restore_attribute(owner, name, previous)

    @property
    def applied(self) -> bool:
        return bool(self._changes)

    @property
    def original(self) -> Any:
        """What the target's attribute held before this patch (None when not applied)."""
        for _owner, name, previous in self._changes:
            if name == self.attribute:
                return None if previous is _MISSING else previous
        return None


def _distinct(callables: Iterable[Callable[[], None] | None]) -> list[Callable[[], None]]:
    seen: list[Callable[[], None]] = []
    for function in callables:
        if function is not None and all(function is not s for s in seen):
            seen.append(function)
    return seen


def apply_all(patches: Sequence[Patch]) -> None:
    """Apply every patch or none: check all, prepare, install in order; any failure (an
    exception of any kind) reverts everything installed, in reverse order, and is raised."""
    patches = list(patches)
    if len({id(p) for p in patches}) != len(patches):
        raise PatchError("a patch object is listed twice")
    for patch in patches:
        patch.check()
    for prepare in _distinct(p.prepare for p in patches):
        prepare()
    started: list[Patch] = []
    try:
        for patch in patches:
            started.append(patch)
            patch.install()
    except BaseException:
        for patch in reversed(started):
            patch.revert()
        raise


def revert_all(patches: Sequence[Patch]) -> None:
    """Revert the patches in reverse order."""
    for patch in reversed(patches):
        patch.revert()


@contextlib.contextmanager
def applied(patches: Sequence[Patch]) -> Iterator[None]:
    """The patches applied (all or none) for the duration of the block, reverted after it in
    reverse order."""
    apply_all(patches)
    try:
        yield
    finally:
        revert_all(patches)


def describe(patches: Sequence[Patch]) -> str:
    """The patches for the plugin's log line: names once each, the ungrouped first, then each
    group as ``GROUP: names``."""
    groups: dict[str, list[str]] = {}
    for patch in patches:
        names = groups.setdefault(patch.group, [])
        if patch.name not in names:
            names.append(patch.name)
    ungrouped = groups.pop("", [])
    parts = [", ".join(ungrouped)] if ungrouped else []
    parts += [f"{group}: {', '.join(names)}" for group, names in groups.items()]
    return "; ".join(parts)
