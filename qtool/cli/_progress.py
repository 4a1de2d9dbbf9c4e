"""Progress on stderr for commands that run over data.

On a terminal: a bar per stage (click's). Elsewhere (a CI log, ``2>&1 | cat``,
a file): one line when each stage starts and a final timing line, so a long
run never looks hung and a log stays short.
"""

from __future__ import annotations

import sys
import time

import click


class StageProgress:
    """``update(stage, done, total[, unit])`` after each batch (or other step); ``finish()`` at the end."""

    def __init__(self, command: str, terminal: bool | None = None):
        self.command = command
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self.stage: str | None = None
        self.bar = None
        self.done = 0
        self.start = time.perf_counter()
        self.stage_start = self.start
        self.seconds: dict[str, float] = {}

    def update(self, stage: str, done: int, total: int, unit: str = "samples") -> None:
        if stage != self.stage or done < self.done:  # a new stage, or another pass of it (an If branch's)
            self._end_stage()
            self.stage, self.done, self.stage_start = stage, 0, time.perf_counter()
            if self.terminal:
                self.bar = click.progressbar(length=total, label=stage, file=sys.stderr, show_pos=True)
                self.bar.__enter__()
            else:
                count = f" ({total} {unit})" if total and unit else ""
                click.echo(f"qtool {self.command}: {stage}{count}", err=True)
        if self.bar is not None:
            self.bar.update(done - self.done)
        self.done = done

    def _end_stage(self) -> None:
        if self.stage is not None:
            self.seconds[self.stage] = self.seconds.get(self.stage, 0.0) + time.perf_counter() - self.stage_start
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
        self.stage = None

    def finish(self) -> None:
        """Close the bar; print the timing line (also on a terminal, after the bars)."""
        self._end_stage()
        stages = ", ".join(f"{name} {s:.1f} s" for name, s in self.seconds.items())
        total = time.perf_counter() - self.start
        click.echo(f"qtool {self.command}: done in {total:.1f} s" + (f" ({stages})" if stages else ""), err=True)

    def close(self) -> None:
        """Close the bar without the timing line (on an error)."""
        self._end_stage()


class Calibrating:
    """The progress callback of the commands that calibrate: ``(done, total)`` of the calibration passes, and
    ``stage(name, done, total)`` of the other steps that report (loading and writing a large model, the check of
    the int8 model, ``--calibration-method auto``'s rewrites)."""

    def __init__(self, progress: StageProgress):
        self.progress = progress

    def __call__(self, done: int, total: int) -> None:
        self.progress.update("calibrating", done, total)

    def stage(self, name: str, done: int, total: int) -> None:
        self.progress.update(name, done, total, unit="")
