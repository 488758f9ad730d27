"""The CLI's dispatcher: usage, unknown commands, exit codes."""
from conftest import run_augur


def test_no_arguments_prints_usage_and_exits_2():
    p = run_augur()
    assert p.returncode == 2
    assert b"usage: augur" in p.stderr


def test_help_lists_every_command():
    p = run_augur("--help", check=True)
    for cmd in (b"info", b"tokenize", b"detokenize", b"template"):
        assert cmd in p.stdout


def test_unknown_command_is_a_usage_error():
    p = run_augur("frobnicate")
    assert p.returncode == 2
    assert b"unknown command 'frobnicate'" in p.stderr
