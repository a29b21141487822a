"""``doctor``: what the plugin would do here, and why.

Prints the entry point, ``VLLM_PLUGINS``, the plugin's configuration, the installed vLLM build
(and, for a release without a table of its own, the supported one whose fingerprints it
matches) and the supported ones, the platform and the plugin's verdict on it, vLLM's
``VLLM_BATCH_INVARIANT`` and ``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE`` (read as the plugin
reads them, ``plugin/vllm_env.py``), every function the plugin replaces or relies on with its
fingerprint status, the verdict, and which engine steps are routed
(:func:`~vllm_gdn_invariant.plugin.scope.routing_scope`).

``doctor --model DIR [vLLM engine flags ...]`` also builds vLLM's config as ``vllm serve``
does (:mod:`vllm_gdn_invariant.cli.serve_config`) and reports prefix caching, the mamba cache
mode, the GDN prefill backend vLLM picks and speculative decoding; the routed steps then
account for them.

Exit status: 0 when the plugin would patch (or is off) and vLLM's config, if asked for,
builds; 1 when the plugin would refuse, or vLLM fails to build its config (or refuses the
prefill backend); 2 when the plugin's configuration is invalid, ``VLLM_BATCH_INVARIANT`` or
``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE`` holds a value vLLM cannot parse, or vLLM's parser
rejects a flag after ``--model DIR``. Each failure is printed on its line; none ends in a
traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shlex
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.version import Version

from vllm_gdn_invariant import __version__, cli
from vllm_gdn_invariant.cli import describe_error
from vllm_gdn_invariant.patches.history_replay import (
    CHECKPOINT_NOTE,
    KV_CONNECTOR_NOTE,
    SPECULATIVE_NOTE,
    replay_off_reason,
    replay_summary,
)
from vllm_gdn_invariant.plugin.config import ConfigError, load_config
from vllm_gdn_invariant.plugin.entry import PluginStatus, plan
from vllm_gdn_invariant.plugin.platform import PlatformCheck, check_platform
from vllm_gdn_invariant.plugin.scope import FLASHINFER_CHECKPOINTS_SINCE, routing_scope
from vllm_gdn_invariant.plugin.versions import installed_vllm, supported_builds
from vllm_gdn_invariant.plugin.vllm_env import BATCH_INVARIANT, PACKED_DECODE, FlagValue, VllmFlag

if TYPE_CHECKING:
    from vllm_gdn_invariant.cli.serve_config import ServeConfig

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT_NAME = "gdn_invariant"
LABEL_WIDTH = 15

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_INVALID = 2


def line(label: str, text: str) -> str:
    return f"{label + ':':<{LABEL_WIDTH}} {text}"


def entry_point_value() -> str | None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == ENTRY_POINT_NAME:
            return ep.value
    return None


def entry_point_line(value: str | None) -> str:
    if value is None:
        return f"{ENTRY_POINT_GROUP}:{ENTRY_POINT_NAME} NOT FOUND (is the package installed?)"
    return f"{ENTRY_POINT_GROUP}:{ENTRY_POINT_NAME} -> {value}"


def plugins_env_loads() -> bool:
    """Whether ``VLLM_PLUGINS`` lets vLLM load this plugin (unset: every plugin is loaded)."""
    value = os.environ.get("VLLM_PLUGINS")
    return value is None or ENTRY_POINT_NAME in value.split(",")


def plugins_env_line() -> str:
    value = os.environ.get("VLLM_PLUGINS")
    if value is None:
        return "unset (vLLM loads every installed plugin, this one included)"
    if plugins_env_loads():
        return f"{value!r} (loads gdn_invariant)"
    return f"{value!r} (does NOT load gdn_invariant; add it to the list)"


def platform_line() -> str:
    import torch

    try:
        from vllm.platforms import current_platform  # doctor also runs without vLLM

        name = f"{type(current_platform).__name__} ({current_platform.device_name})"
    except Exception as exc:  # noqa: BLE001 - doctor reports, it does not fail here
        name = f"unavailable ({exc.__class__.__name__}: {exc})"
    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    return f"{name}; torch {torch.__version__}; {cuda}"


def read_platform() -> tuple[PlatformCheck | None, str | None]:
    """The plugin's platform check, or None and the reason it could not be made."""
    try:
        return check_platform(), None
    except Exception as exc:  # noqa: BLE001 - doctor reports, it does not fail here
        return None, describe_error(exc)


def platform_check_text(check: PlatformCheck | None, error: str | None) -> str:
    if check is None:
        return f"not made: vLLM's platform could not be read ({error})"
    if check.refusal is not None:
        return f"REFUSED: {check.refusal}"
    if check.is_cpu:
        return (
            "CPU (vLLM's CPU build): supported, the patch is inert here: GDN layers run "
            "forward_cpu, which does not call _forward_core"
        )
    return "CUDA: supported"


@dataclass(frozen=True)
class FlagReport:
    """One of vLLM's variables as the plugin reads it: its value, or why vLLM cannot read it."""

    value: FlagValue | None
    invalid: str | None = None

    @classmethod
    def read(cls, flag: VllmFlag) -> FlagReport:
        try:
            return cls(flag.read())
        except ConfigError as exc:
            return cls(None, str(exc))

    @property
    def enabled(self) -> bool | None:
        """On or off; None when the value is invalid."""
        return None if self.value is None else self.value.enabled


def batch_invariant_text(report: FlagReport) -> str:
    if report.value is None:
        return f"INVALID: {report.invalid}"
    if report.value.enabled:
        return report.value.describe() + ": the plugin adds the batch-invariance patches"
    return report.value.describe()


def packed_decode_text(report: FlagReport) -> str:
    if report.value is None:
        return f"INVALID: {report.invalid}"
    if report.value.raw is None:
        return f"on ({PACKED_DECODE.name} unset; vLLM's default is {PACKED_DECODE.default})"
    if report.value.enabled:
        return report.value.describe()
    return (
        report.value.describe()
        + ": vLLM runs every decode row through fused_sigmoid_gating_delta_rule_update"
    )


def build_text(status: PluginStatus) -> str:
    """The installed build as the guard saw it (with the supported build whose fingerprints
    it matches, when it has no table of its own)."""
    if status.guard is not None:
        return status.guard.describe_build()
    installed = installed_vllm()
    if installed is None:
        return "not installed"
    why = "mode off" if status.config.installs_nothing else "the plugin refuses first"
    return f"{installed.describe()} (fingerprints not checked: {why})"


def target_lines(status: PluginStatus) -> list[str]:
    guard = status.guard
    if guard is None or not guard.checks:
        return []
    width = max(len(c.target.qualname) for c in guard.checks)
    return ["targets:"] + [
        f"  {check.role:<10} {check.target.qualname:<{width}}  "
        f"expected {check.expected or '-':<16}  found {check.found or '-':<16}  "
        f"{check.state.value}"
        for check in guard.checks
    ]


def not_patched_reason(status: PluginStatus, entry_point: str | None) -> str | None:
    """Why the plugin patches nothing in vLLM's processes, None when it patches."""
    if entry_point is None:
        return "its entry point is not installed"
    if not plugins_env_loads():
        return "VLLM_PLUGINS does not name gdn_invariant, so vLLM does not load it"
    if status.refusal is not None:
        return "it refuses (see verdict)"
    if not status.will_patch:
        return "mode off"
    return None


@dataclass(frozen=True)
class ServeResult:
    """vLLM's config for ``--model DIR`` and its flags, or why there is none."""

    given: str
    config: ServeConfig | None
    failure: str | None = None
    code: int = EXIT_OK


def load_serve(model: str, flags: list[str], prog: str) -> ServeResult:
    """Build vLLM's config; a failure is kept, with its exit code, for the report."""
    given = shlex.join(["--model", model, *flags])
    try:
        # vLLM's config modules, imported only when --model asks for them
        from vllm_gdn_invariant.cli import serve_config
    except Exception as exc:  # noqa: BLE001 - doctor reports, it does not fail here
        return ServeResult(
            given, None, f"FAILED to import vLLM: {describe_error(exc)}", EXIT_REFUSED
        )
    try:
        return ServeResult(given, serve_config.build_serve_config(model, flags))
    except serve_config.ServeFlagsError as exc:
        message = f"vLLM's parser rejects the flags: {exc}"
        print(f"{prog}: error: {message}", file=sys.stderr)
        return ServeResult(given, None, f"INVALID ({given}): {message}", EXIT_INVALID)
    except Exception as exc:  # noqa: BLE001 - vLLM's own failure, reported on its line
        failure = f"FAILED ({given}): vLLM cannot build its config: {describe_error(exc)}"
        return ServeResult(given, None, failure, EXIT_REFUSED)


def serve_report(result: ServeResult, platform: PlatformCheck | None) -> list[str]:
    serve = result.config
    if serve is None:
        return [line("vLLM config", str(result.failure))]
    if serve.prefill_backend_error is not None:
        backend = f"ERROR: vLLM's _resolve_gdn_prefill_backend raised {serve.prefill_backend_error}"
    else:
        backend = (
            f"{serve.prefill_backend} (vLLM's _resolve_gdn_prefill_backend; requested "
            f"{serve.requested_prefill_backend})"
        )
        if platform is not None and platform.is_cpu:
            backend += "; not used on CPU: GDN layers run forward_cpu"
    return [
        line(
            "vLLM config",
            f"{result.given} (AsyncEngineArgs.create_engine_config, as in vllm serve)",
        ),
        line("  model", serve.architecture),
        line("  prefix cache", "on" if serve.prefix_caching else "off"),
        line("  mamba cache", f"mamba_cache_mode={serve.mamba_cache_mode}"),
        line("  GDN prefill", backend),
        line("  speculative", f"on ({serve.speculative})" if serve.speculative_on else "off"),
    ]


def run(args: argparse.Namespace) -> int:
    """Print the report; return the exit status."""
    lines = [f"vllm-gdn-invariant {__version__} doctor"]
    entry_point = entry_point_value()
    lines.append(line("entry point", entry_point_line(entry_point)))
    lines.append(line("VLLM_PLUGINS", plugins_env_line()))
    try:
        config = load_config()
    except ConfigError as exc:
        lines.append(line("config", f"INVALID: {exc}"))
        lines.append(line("verdict", "the plugin would raise at load and patch nothing"))
        print("\n".join(lines), flush=True)
        return EXIT_INVALID

    serve = None
    if args.model is not None:
        # built before anything is printed: vLLM's own log lines come before the report
        serve = load_serve(args.model, list(args.serve_flags), args.command_parser.prog)
    code = EXIT_OK if serve is None else serve.code

    status = plan(config)
    platform, platform_error = read_platform()
    batch_invariant = FlagReport.read(BATCH_INVARIANT)
    packed = FlagReport.read(PACKED_DECODE)
    lines += [
        line("config", config.describe()),
        line("vLLM", build_text(status)),
        line("supported", ", ".join(supported_builds())),
        line("platform", platform_line()),
        line("platform check", platform_check_text(platform, platform_error)),
        line("invariance", batch_invariant_text(batch_invariant)),
        line("packed decode", packed_decode_text(packed)),
        *target_lines(status),
    ]
    if batch_invariant.invalid or packed.invalid:
        code = max(code, EXIT_INVALID)
    if status.refusal is not None:
        consequence = "raise at startup (strict)" if config.strict else "patch nothing"
        lines.append(line("verdict", f"REFUSE ({consequence}): {status.refusal}"))
        code = max(code, EXIT_REFUSED)
    else:
        lines.append(line("verdict", status.action()))

    if serve is None:
        lines.append(
            line("vLLM config", "not built (doctor --model DIR [vLLM flags] builds and reports it)")
        )
    else:
        lines += serve_report(serve, platform)

    served = None if serve is None else serve.config
    if served is not None and served.prefill_backend_error:
        code = max(code, EXIT_REFUSED)
    installed = installed_vllm()
    scope = routing_scope(
        platform=platform,
        packed_decode=packed.enabled is not False,
        not_patched=not_patched_reason(status, entry_point),
        speculative=None if served is None else served.speculative_on,
        prefill_backend=None if served is None else served.prefill_backend,
        mamba_cache_mode=None if served is None else served.mamba_cache_mode,
        vllm_version=None if installed is None else installed.release,
    )
    undetermined = None
    if scope.routed and packed.enabled is None:
        undetermined = f"{PACKED_DECODE.name} is invalid"
    elif scope.routed and serve is not None and served is None:
        undetermined = "vLLM's config was not built"
    elif scope.routed and served is not None and served.prefill_backend_error is not None:
        undetermined = "vLLM refuses the GDN prefill backend"
    if undetermined is None:
        lines.append(line("routed", scope.routed_text()))
        lines.append(line("left to vLLM", scope.left_text()))
    else:
        lines.append(line("routed", f"not determined: {undetermined}"))
        lines.append(line("left to vLLM", f"not determined: {undetermined}"))
    lines.append(line("history replay", replay_text(config, served, platform, installed)))
    print("\n".join(lines), flush=True)
    return code


def replay_text(config, served, platform: PlatformCheck | None, installed) -> str:
    """Whether a preempted request's recomputation replays its history, and why not."""
    try:
        batch_invariant = BATCH_INVARIANT.read().enabled
    except ConfigError as exc:
        return f"not determined: {exc}"
    off = replay_off_reason(config.replay, config.mode.value, batch_invariant)
    if off is not None:
        return f"off ({off})"
    if platform is not None and platform.is_cpu:
        return "installed, inert on CPU (GDN layers run forward_cpu)"
    if served is None:
        return (
            "on without speculative decoding and in-chunk prefill checkpoints "
            "(doctor --model DIR [vLLM flags] tells for a deployment)"
        )
    gaps = []
    if served.speculative_on:
        gaps.append(SPECULATIVE_NOTE)
    release = None if installed is None else installed.release
    if (
        served.mamba_cache_mode == "align"
        and served.prefill_backend == "flashinfer"
        and release is not None
        and Version(release) >= FLASHINFER_CHECKPOINTS_SINCE
    ):
        gaps.append(CHECKPOINT_NOTE)
    return replay_summary(gaps, [KV_CONNECTOR_NOTE] if served.kv_connector else [])


def main(argv: list[str] | None = None) -> int:
    """``doctor`` with its own arguments, as ``vllm-gdn-invariant doctor ARGS``."""
    return cli.main(["doctor", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
