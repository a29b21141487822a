"""vLLM's own config for a model and its engine flags, as ``vllm serve`` builds it.

vLLM's ``FlexibleArgumentParser`` with ``AsyncEngineArgs.add_cli_args`` parses the flags,
``AsyncEngineArgs.from_cli_args`` and ``create_engine_config`` build the ``VllmConfig``
(same signatures in vLLM 0.26–0.34); ``vllm serve`` makes the same calls, with its
server flags (``--host``, ``--port``, ...) added to the parser, which this one does not
accept. The GDN prefill backend is the one vLLM's own
``_resolve_gdn_prefill_backend(vllm_config)`` returns (a private function of vLLM's
``qwen_gdn_linear_attn`` module; its GDN layers call it when they are built).

``add_cli_args`` loads vLLM's general plugins, as ``vllm serve`` does, so this process
registers the plugin like any vLLM process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
    _resolve_gdn_prefill_backend,
)
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser

from vllm_gdn_invariant.cli import describe_error


class ServeFlagsError(ValueError):
    """vLLM's argument parser rejected the flags."""


class ServeFlagParser(FlexibleArgumentParser):
    """vLLM's parser, raising :class:`ServeFlagsError` where it would print usage and exit."""

    def error(self, message: str) -> NoReturn:
        raise ServeFlagsError(message)


@dataclass(frozen=True)
class ServeConfig:
    """What vLLM's config says about the GDN layers' steps."""

    architecture: str
    prefix_caching: bool
    mamba_cache_mode: str
    requested_prefill_backend: str | None
    prefill_backend: str | None
    prefill_backend_error: str | None
    speculative: str | None
    kv_connector: bool = False

    @property
    def speculative_on(self) -> bool:
        return self.speculative is not None


def parse_serve_flags(model: str, flags: Sequence[str]) -> AsyncEngineArgs:
    """vLLM's engine arguments for ``--model model`` and ``flags``.

    Raises :class:`ServeFlagsError` with vLLM's message when its parser rejects them.
    """
    parser = AsyncEngineArgs.add_cli_args(ServeFlagParser(prog="vllm serve", add_help=False))
    try:
        namespace = parser.parse_args(["--model", model, *flags])
    except ServeFlagsError:
        raise
    except Exception as exc:  # noqa: BLE001 - vLLM's flag preprocessing raises plain errors
        raise ServeFlagsError(describe_error(exc)) from exc
    return AsyncEngineArgs.from_cli_args(namespace)


def build_serve_config(model: str, flags: Sequence[str]) -> ServeConfig:
    """Parse, build vLLM's config as ``vllm serve`` does, and read what matters here.

    Raises :class:`ServeFlagsError` for rejected flags and whatever vLLM raises when it
    cannot build the config. A prefill backend that vLLM refuses is reported in
    ``prefill_backend_error`` (vLLM raises it when it builds the GDN layers).
    """
    engine_args = parse_serve_flags(model, flags)
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    requested = active = error = None
    try:
        requested, active = _resolve_gdn_prefill_backend(vllm_config)
    except Exception as exc:  # noqa: BLE001 - reported as vLLM's refusal of the backend
        error = describe_error(exc)
    spec = vllm_config.speculative_config
    speculative = None
    if spec is not None:
        speculative = f"{spec.method}, {spec.num_speculative_tokens} speculative tokens"
    cache = vllm_config.cache_config
    return ServeConfig(
        architecture=vllm_config.model_config.architecture,
        prefix_caching=bool(cache.enable_prefix_caching),
        mamba_cache_mode=str(cache.mamba_cache_mode),
        requested_prefill_backend=requested,
        prefill_backend=active,
        prefill_backend_error=error,
        speculative=speculative,
        kv_connector=vllm_config.kv_transfer_config is not None,
    )
