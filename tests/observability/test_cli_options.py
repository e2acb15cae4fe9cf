"""The worker's observability options are checked as the command line is parsed: a wrong
value is a usage error (exit 2) naming the option, before anything connects."""

from __future__ import annotations

import pytest

from tests.test_cli_options import URL, run_main


@pytest.mark.parametrize(
    ("args", "option", "expected"),
    [
        (("--log-format", "yaml"), "--log-format", "json, text"),
        (("--log-level", "LOUD"), "--log-level", "DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ],
)
def test_an_unknown_log_option_is_a_usage_error_naming_it(capsys, args, option, expected):
    code, err = run_main(capsys, "worker", *URL, *args)

    assert code == 2
    assert option in err
    assert expected in err


def test_the_log_level_is_taken_in_any_case(capsys):
    from geneva_drive.cli.values import log_level

    assert log_level("debug") == "DEBUG"
