"""``stats --watch``: the refresh loop, driven by an iteration count and a fake sleep."""

from __future__ import annotations

import io

from rich.console import Console
from rich.text import Text

from geneva_drive.cli.ops import watch


def test_watch_renders_n_times_and_sleeps_the_interval_between_renders():
    renders: list[int] = []
    sleeps: list[float] = []

    def render() -> Text:
        renders.append(len(renders))
        return Text(f"render {len(renders)}")

    out = io.StringIO()
    done = watch(render, interval=2.5, iterations=3, out=Console(file=out), sleep=sleeps.append)

    assert done == 3
    assert renders == [0, 1, 2]
    assert sleeps == [2.5, 2.5]
    assert "render 3" in out.getvalue()


def test_watch_with_one_iteration_renders_once_and_never_sleeps():
    sleeps: list[float] = []

    done = watch(
        lambda: Text("x"),
        interval=1,
        iterations=1,
        out=Console(file=io.StringIO()),
        sleep=sleeps.append,
    )

    assert done == 1 and sleeps == []
