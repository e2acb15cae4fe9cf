"""Every numeric and list option of every command is checked as the command line is parsed:
zero or negative where that makes no sense, NaN, infinity, an empty queue name — each is a
usage error (exit 2) that names the option, before anything connects or runs."""

from __future__ import annotations

import pytest

from geneva_drive.cli.main import main


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    code = exited.value.code
    return (code if isinstance(code, int) else 0), capsys.readouterr().err


URL = ("--database-url", "sqlite:///never-opened.db")


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("worker", "--poll-interval", "0"), "--poll-interval"),
        (("worker", "--poll-interval", "-1"), "--poll-interval"),
        (("worker", "--poll-interval", "nan"), "--poll-interval"),
        (("worker", "--grace-period", "-1"), "--grace-period"),
        (("worker", "--grace-period", "inf"), "--grace-period"),
        (("worker", "--wait-for-database", "-5"), "--wait-for-database"),
        (("worker", "--queues", ""), "--queues"),
        (("worker", "--queues", "orders,,mail"), "--queues"),
        (("worker", "--queues", " , "), "--queues"),
        (("worker", "--lease", "nan"), "--lease"),
        (("worker", "--lease", "0"), "--lease"),
        (("worker", "--concurrency", "0"), "--concurrency"),
        (("worker", "--housekeeping-interval", "0"), "--housekeeping-interval"),
        (("worker", "--housekeeping-interval", "-300"), "--housekeeping-interval"),
        (("worker", "--heartbeat-interval", "nan"), "--heartbeat-interval"),
        (("worker", "--heartbeat-interval", "0"), "--heartbeat-interval"),
        (("stats", "--watch", "--interval", "-3"), "--interval"),
        (("stats", "--watch", "--interval", "0"), "--interval"),
        (("stats", "--watch", "--iterations", "0"), "--iterations"),
        (("migrate", "--wait-for-database", "-5"), "--wait-for-database"),
        (("housekeeping", "--wait-for-database", "nan"), "--wait-for-database"),
        (("dispatch", "--app", "x", "--interval", "0"), "--interval"),
        (("dispatch", "--app", "x", "--wait-for-database", "-1"), "--wait-for-database"),
        (("dashboard", "--read-only", "--port", "70000"), "--port"),
        (("list", "--limit", "0"), "--limit"),
    ],
)
def test_a_nonsense_value_is_a_usage_error_naming_the_option(capsys, args, option):
    code, err = run_main(capsys, *args, *URL)

    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"geneva-drive {args[0]}: error: Invalid value for '{option}'"), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "option", "expected"),
    [
        (("list", "--limit", "abc"), "--limit", "a whole number"),
        (("show", "x"), "ID", "a whole number"),
        (("cancel", "1", "2x", "--yes"), "ID", "a whole number"),
        (("stats", "--watch", "--interval", "soon"), "--interval", "a number"),
        (("dashboard", "--read-only", "--port", "http"), "--port", "a whole number"),
    ],
)
def test_a_value_of_the_wrong_kind_is_a_usage_error_quoting_it(capsys, args, option, expected):
    code, err = run_main(capsys, *args, *URL)

    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"geneva-drive {args[0]}: error: Invalid value for '{option}'"), err
    bad = next(a for a in args if a in {"abc", "x", "2x", "soon", "http"})
    assert f"{bad!r} is not {expected}" in line, err


def test_numbers_are_read_as_python_reads_them():
    """Whole numbers may be written 5.0 or with spaces around (as pydantic took them)."""
    from geneva_drive.cli.conversion import converted

    assert converted(int, " 7 ") == 7
    assert converted(int, "5.0") == 5
    assert converted(float, "1e-3") == 0.001
    assert converted(float, "nan") != converted(float, "nan")  # NaN: the callbacks refuse it
    with pytest.raises(ValueError, match=r"'5\.5' is not a whole number"):
        converted(int, "5.5")


def test_the_message_says_what_is_expected_and_quotes_the_value(capsys):
    _, err = run_main(capsys, "worker", "--poll-interval", "-1", *URL)

    assert "-1" in err and "above 0" in err


def test_an_empty_queues_option_says_how_to_serve_every_queue(capsys):
    _, err = run_main(capsys, "worker", "--queues", "", *URL)

    assert "leave out --queues to serve every queue" in err


def test_app_modules_come_from_geneva_drive_app_separated_by_spaces(capsys, monkeypatch):
    monkeypatch.setenv("GENEVA_DRIVE_APP", "tests.worker.apps tests.worker.apps:NoSuchThing")

    code, err = run_main(capsys, "housekeeping", *URL)

    assert code == 2, err
    assert "--app 'tests.worker.apps:NoSuchThing'" in err  # the second one was imported too


def test_dispatch_takes_its_celery_app_from_geneva_drive_app(capsys, monkeypatch):
    monkeypatch.setenv("GENEVA_DRIVE_APP", "tests.worker.apps:NoSuchThing")

    code, err = run_main(capsys, "dispatch", "--once", *URL)

    assert "Missing option '--app'" not in err
    assert "NoSuchThing" in err, err
    assert code == 2


def test_the_command_line_is_built_with_the_invoked_command_alone():
    from geneva_drive.cli.main import app, command_line

    every = {info.name or info.callback.__name__ for info in app.registered_commands}
    assert set(command_line("list").commands) == {"list"}
    assert set(command_line("housekeeping").commands) == {"housekeeping"}
    assert len(command_line(None).commands) == len(every)  # --help lists them all
    assert len(command_line("lsit").commands) == len(every)  # a typo: Click names it


def test_help_lists_every_command_and_a_mistyped_one_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in ("migrate", "worker", "list", "show", "dashboard"))

    code, err = run_main(capsys, "lsit", *URL)
    assert code == 2
    assert "No such command 'lsit'" in err, err


def test_help_before_a_command_name_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help", "list"])  # Click shows the group's help: every command in it
    out = capsys.readouterr().out
    assert all(name in out for name in ("migrate", "worker", "list", "show", "dashboard"))
