"""What cannot be awaited to one outcome is refused when the class is defined, by name."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from geneva_drive import Workflow, step
from geneva_drive.core.errors import StepConfigurationError
from geneva_drive.runtime.worker import Worker
from geneva_drive.runtime.worker_options import WorkerOptionError


def test_an_async_generator_step_is_refused_naming_the_class_and_step():
    with pytest.raises(StepConfigurationError) as raised:

        class Streams(Workflow):
            @step
            async def each_item(self):
                yield 1

    message = str(raised.value)
    assert "Streams" in message and "'each_item'" in message
    assert "async generator" in message


def test_an_async_around_hook_is_refused_naming_the_class():
    with pytest.raises(StepConfigurationError, match=r"AsyncAround\.around_step_execution"):

        class AsyncAround(Workflow):
            async def around_step_execution(self, execution, proceed):
                return proceed()

            @step
            def only(self) -> None:
                pass


class NeedsTheLoop(Workflow):
    @step
    def sync_first(self) -> None:
        pass

    @step
    async def then_async(self) -> None:
        pass


def test_async_concurrency_zero_with_async_steps_loaded_names_the_class_and_step(gd):
    with pytest.raises(WorkerOptionError) as raised:
        Worker(config=gd, async_concurrency=0)
    assert raised.value.parameter == "async_concurrency"
    # The first async step of the classes loaded (this module's, and any other test's).
    assert re.search(r"\w+\.step '\w+' is async def", str(raised.value))


def test_the_cli_refuses_async_concurrency_zero_as_a_usage_error(installed_database_url):
    from geneva_drive.cli.main import app

    result = CliRunner().invoke(
        app,
        [
            "worker",
            "--database-url",
            installed_database_url,
            "--app",
            "tests.async_steps.test_bad_input",
            "--async-concurrency",
            "0",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "--async-concurrency" in result.output
    assert "async def" in result.output
