"""The argparse command line, in process (the parser imports nothing from vLLM)."""

from __future__ import annotations

import pytest

from vllm_gdn_invariant.cli import main, parse_args

PROG = "vllm-gdn-invariant"


def run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as stop:
        main(argv, prog=PROG)
    return stop.value.code


def test_top_level_help_exits_0_and_lists_both_subcommands(capsys):
    assert run(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {PROG} [-h] {{doctor,demo,report}}")
    assert "doctor" in out and "demo" in out and "report" in out


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("doctor", ["--model DIR"]),
        ("demo", ["--model DIR", "--max-tokens N", "--json FILE"]),
        ("report", ["--plot FILE", "LOG.jsonl"]),
    ],
)
def test_subcommand_help_exits_0_with_its_usage_and_options(capsys, command, options):
    assert run([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {PROG} {command} [-h]")
    for option in options:
        assert option in out


def test_doctor_help_states_the_exit_statuses(capsys):
    run(["doctor", "-h"])
    out = capsys.readouterr().out
    assert "exit status:" in out
    for code in ("0  the plugin would patch", "1  the plugin would refuse", "2  the plugin's"):
        assert code in out


def test_no_subcommand_prints_usage_on_stderr_and_exits_2(capsys):
    assert run([]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {PROG}")
    assert "required: {doctor,demo,report}" in err


def test_unknown_subcommand_exits_2(capsys):
    assert run(["bogus"]) == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["doctor", "--bogus"], ["demo", "--bogus"], ["--bogus", "doctor"], ["doctor", "stray"]],
)
def test_unknown_arguments_exit_2_with_the_message_on_stderr(capsys, argv):
    assert run(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "unrecognized arguments:" in captured.err


def test_doctor_without_model_names_where_vllm_flags_go(capsys):
    run(["doctor", "--enable-prefix-caching"])
    assert "vLLM flags are accepted after --model DIR" in capsys.readouterr().err


def test_doctor_passes_every_argument_after_model_to_vllm_in_order():
    flags = [
        "--no-enable-prefix-caching",
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 2}',
        "--max-model-len",
        "512",
        "-tp",
        "1",
        '--additional-config={"gdn_prefill_backend": "triton"}',
        "--enforce-eager",
    ]
    args = parse_args(["doctor", "--model", "DIR", *flags])
    assert args.model == "DIR"
    assert args.serve_flags == flags


def test_doctor_does_not_take_a_vllm_flag_for_an_abbreviation_of_model():
    args = parse_args(["doctor", "--model", "DIR", "--mod", "x"])
    assert (args.model, args.serve_flags) == ("DIR", ["--mod", "x"])


def test_demo_keeps_its_options():
    args = parse_args(
        ["demo", "--json", "out.json", "--model", "DIR", "--max-tokens", "6", "--seed", "3"]
    )
    assert (args.json, args.model, args.max_tokens, args.seed) == ("out.json", "DIR", 6, 3)
    defaults = parse_args(["demo"])
    assert (defaults.json, defaults.model, defaults.max_tokens, defaults.seed) == (
        None,
        None,
        16,
        0,
    )


def test_demo_help_says_the_seed_seeds_the_weights_not_sampling(capsys):
    assert run(["demo", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--seed N seed of the tiny model's random weights" in help_text
    assert "sampling seed" not in help_text
