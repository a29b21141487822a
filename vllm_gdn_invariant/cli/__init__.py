"""The command line: ``vllm-gdn-invariant`` (or ``python -m vllm_gdn_invariant``)
``doctor|demo|report``.

The parser lives here and imports nothing from vLLM, so ``--help`` and usage errors answer at
once; a subcommand's module, which imports vLLM, is loaded when that subcommand runs and
provides ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

CONSOLE_SCRIPT = "vllm-gdn-invariant"
MODULE_PROG = "python -m vllm_gdn_invariant"

DESCRIPTION = (
    "vLLM plugin that makes the Gated DeltaNet decode step of Qwen3-Next / Qwen3.5 batch-invariant."
)

DOCTOR_DESCRIPTION = """\
Print what the plugin would do in this environment, and why: its entry point, VLLM_PLUGINS,
its configuration, the installed vLLM build and the supported ones, the platform and the
plugin's verdict on it, vLLM's VLLM_BATCH_INVARIANT and VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE,
the fingerprint of every vLLM function it replaces or relies on, the verdict, and which engine
steps are routed.

With --model DIR, every further argument is one of vLLM's engine flags as `vllm serve` takes
them (--enable-prefix-caching, --no-enable-prefix-caching, --speculative-config '{...}',
--additional-config '{"gdn_prefill_backend": "triton"}', --enforce-eager, ...; server flags
such as --port are not accepted). doctor builds vLLM's config from them as `vllm serve` does
and reports prefix caching, the mamba cache mode, the GDN prefill backend vLLM picks and
speculative decoding.
"""

DOCTOR_EPILOG = """\
exit status:
  0  the plugin would patch (or is off), and vLLM's config, if asked for, builds
  1  the plugin would refuse (it patches nothing), or vLLM would fail: its config does not
     build from --model DIR and the flags, or it refuses the GDN prefill backend (each on
     its line)
  2  the plugin's configuration is invalid, VLLM_BATCH_INVARIANT or
     VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE holds a value vLLM cannot parse, vLLM's parser
     rejects a flag after --model DIR, or the command line is wrong
"""

DEMO_DESCRIPTION = """\
Write a tiny Qwen3-Next model (config, a locally built tokenizer, seeded random weights, so
that greedy tokens depend on the context) to a temporary folder, start vLLM offline with
VLLM_PLUGINS=gdn_invariant, run a target request alone and then among requests of mixed
lengths under a small token budget (so that prompts are split and steps mix prefills and
decodes), and report whether the target's tokens and logprobs are bitwise identical.

On a CUDA GPU the engine runs with VLLM_BATCH_INVARIANT=1 (the plugin's batch-invariant
mode); on CPU without it (vLLM's CPU build has no batch-invariant MoE backend), and the
report says what a CPU run can and cannot show.
"""

DEMO_EPILOG = """\
exit status:
  0  IDENTICAL: the target's tokens and logprobs are the same bits alone and batched
  1  DIFFERENT, or vLLM did not start (its error is printed)
  2  the command line is wrong
"""


def describe_error(exc: BaseException) -> str:
    """An exception as one line: its type and its message with whitespace collapsed."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def program_name(argv0: str | None = None) -> str:
    """``vllm-gdn-invariant`` when run as the console script, else the ``python -m`` form."""
    name = os.path.basename(sys.argv[0] if argv0 is None else argv0)
    return CONSOLE_SCRIPT if name == CONSOLE_SCRIPT else MODULE_PROG


REPORT_DESCRIPTION = """\
Read the JSONL files of the shadow checker (VLLM_GDN_INVARIANT_SHADOW, one file per process)
and print, for each reference and provider found, a table per GDN layer and field (output,
recurrent state, conv state): checks, checks with a difference, elements compared and
differing, max |diff|, max ULP distance and the ULP histogram. --plot FILE also draws the ULP
histograms (needs matplotlib: pip install 'vllm-gdn-invariant[plot]').
"""

REPORT_EPILOG = """\
exit status:
  0  the report is printed (and the figure written)
  1  a file cannot be read or holds a line that is not a shadow record, or no file holds a check
  2  the command line is wrong
"""


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser with the ``doctor``, ``demo`` and ``report`` subparsers."""
    parser = argparse.ArgumentParser(prog=prog or program_name(), description=DESCRIPTION)
    commands = parser.add_subparsers(
        dest="command", metavar="{doctor,demo,report}", title="commands", required=True
    )

    doctor = commands.add_parser(
        "doctor",
        usage="%(prog)s [-h] [--model DIR [vLLM engine flags ...]]",
        help="what the plugin would do here, and which steps it routes",
        description=DOCTOR_DESCRIPTION,
        epilog=DOCTOR_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # vLLM's flags must not be taken for abbreviations of --model
    )
    doctor.add_argument(
        "--model",
        metavar="DIR",
        help="model folder or name; build vLLM's config for it from the vLLM flags that follow",
    )
    doctor.set_defaults(command_parser=doctor, serve_flags=[])

    demo = commands.add_parser(
        "demo",
        help="one request alone and among others, with the plugin, on this machine",
        description=DEMO_DESCRIPTION,
        epilog=DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "--model",
        metavar="DIR",
        help="a model folder (its own weights) instead of the tiny default",
    )
    demo.add_argument(
        "--batch-invariant",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run with VLLM_BATCH_INVARIANT=1 (default: on with CUDA, off on CPU; "
        "an exported VLLM_BATCH_INVARIANT is followed)",
    )
    demo.add_argument(
        "--attention-backend",
        metavar="NAME",
        help="vLLM's attention backend for the attention layers, e.g. TRITON_ATTN "
        "(default: vLLM's choice)",
    )
    demo.add_argument("--max-tokens", type=int, default=16, metavar="N", help="tokens per request")
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="seed of the tiny model's random weights (not used with --model), also given to "
        "vLLM as its seed; decoding is greedy, so it draws no samples",
    )
    demo.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    demo.set_defaults(command_parser=demo)

    report = commands.add_parser(
        "report",
        help="tables (and a plot) of the shadow checker's JSONL files",
        description=REPORT_DESCRIPTION,
        epilog=REPORT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument("logs", nargs="+", metavar="LOG.jsonl", help="shadow JSONL files")
    report.add_argument("--plot", metavar="FILE", help="also draw the ULP histograms to FILE")
    report.set_defaults(command_parser=report)
    return parser


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    """Parse a command line; argparse errors exit 2 with the message on stderr.

    Arguments ``doctor`` does not know are kept as ``serve_flags`` when ``--model`` is given
    (they are vLLM's flags), and are an error otherwise.
    """
    parser = build_parser(prog)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command_parser: argparse.ArgumentParser = args.command_parser
        if args.command == "doctor" and args.model is not None:
            args.serve_flags = unknown
        elif args.command == "doctor":
            command_parser.error(
                f"unrecognized arguments: {' '.join(unknown)} "
                "(vLLM flags are accepted after --model DIR)"
            )
        else:
            command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run one subcommand; return its exit status."""
    args = parse_args(argv, prog)
    command = importlib.import_module(f"{__name__}.{args.command}")
    return command.run(args)
