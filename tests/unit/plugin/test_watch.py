"""`status --watch`: a screen drawn first and again on each change, polling at an interval, Ctrl-C ends it."""

import io
from collections.abc import Iterator

import pytest

from gpuhealth_api import __version__
from gpuhealth_kubectl import cli, watch


class Clock:
    def __init__(self) -> None:
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def screens(*texts: str) -> Iterator[tuple[str, str]]:
    for text in texts:
        yield text, text


def test_draws_the_first_screen_and_each_change_only() -> None:
    source = screens("a\n", "a\n", "b\n", "b\n", "c\n")
    out, clock = io.StringIO(), Clock()
    drawn = watch.watch(lambda: next(source), interval=2.0, count=3, sleep=clock.sleep, out=out, tty=False)
    assert drawn == 3
    text = out.getvalue()
    assert [line for line in text.splitlines() if line in {"a", "b", "c"}] == ["a", "b", "c"]
    assert clock.slept == [2.0, 2.0, 2.0, 2.0]  # polled five times, drew three


def test_a_terminal_is_cleared_before_each_redraw() -> None:
    source = screens("a\n", "b\n")
    out = io.StringIO()
    watch.watch(lambda: next(source), interval=1.0, count=2, sleep=lambda _: None, out=out, tty=True)
    assert out.getvalue().count(watch.CLEAR) == 2


def test_a_change_is_a_change_of_the_data_not_of_the_ages_in_the_table() -> None:
    source = iter([("same", "5s\n"), ("same", "6s\n"), ("new", "7s\n")])
    out = io.StringIO()
    watch.watch(lambda: next(source), interval=1.0, count=2, sleep=lambda _: None, out=out, tty=False)
    assert "5s" in out.getvalue() and "6s" not in out.getvalue() and "7s" in out.getvalue()


def test_ctrl_c_ends_the_watch_quietly() -> None:
    def interrupted() -> tuple[str, str]:
        raise KeyboardInterrupt

    out = io.StringIO()
    assert watch.watch(interrupted, interval=1.0, count=None, sleep=lambda _: None, out=out, tty=False) == 0


@pytest.mark.parametrize("argv", [["status", "--interval", "0"], ["status", "--interval", "x"]])
def test_a_bad_interval_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--watch"])
    assert exit_.value.code == 2
    assert "interval" in capsys.readouterr().err


def test_version_prints_the_distribution_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"kubectl-gpuhealth {__version__}\n"
