"""Shared CLI plumbing: error handling and options used by several commands."""

from __future__ import annotations

import sys

import click

from qtool.errors import QtoolError


class QtoolGroup(click.Group):
    """A click group that turns user errors into one line and a non-zero exit.

    ``--debug`` (before the command name) shows the traceback instead.
    """

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("qtool: interrupted", err=True)
            sys.exit(130)
        except Exception as exc:  # noqa: BLE001 - the one place errors become exit codes
            debug = bool(ctx.obj and ctx.obj.get("debug"))
            if debug:
                raise
            if isinstance(exc, QtoolError):
                click.echo(f"qtool: error: {exc}", err=True)
                sys.exit(2)
            if isinstance(exc, (ValueError, OSError)):
                click.echo(f"qtool: error: {exc}", err=True)
                sys.exit(2)
            click.echo(
                f"qtool: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
                err=True,
            )
            sys.exit(1)


def bits_option(name: str, help_text: str, default: int = 8):
    return click.option(
        name,
        type=click.IntRange(2, 16),
        default=default,
        show_default=True,
        help=help_text,
    )


weight_bits_option = bits_option("--weight-bits", "Bits for weights (2..16).")
activation_bits_option = bits_option("--activation-bits", "Bits for activations (2..16).")
symmetric_option = click.option(
    "--symmetric/--no-symmetric",
    default=False,
    show_default=True,
    help="Symmetric ranges instead of independent min/max.",
)
per_channel_option = click.option(
    "--per-channel/--per-tensor",
    default=True,
    show_default=True,
    help="Weight ranges per output channel, or one per tensor.",
)
scope_option = click.option(
    "--scope", default=None, metavar="PREFIX", help="Only rewrite nodes whose names start with PREFIX."
)
output_option = click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Output model path.",
)
in_place_option = click.option(
    "--in-place", is_flag=True, help="Replace the input model (by an atomic rename at the end)."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
calibration_data_option = click.option(
    "--calibration-data",
    type=click.Path(dir_okay=False),
    default=None,
    help=".npz with one array per model input (first axis = samples), or a .npy for a one-input model.",
)
batch_size_option = click.option(
    "--batch-size", type=click.IntRange(1), default=16, show_default=True, help="Samples per inference batch."
)


def not_built(command: str, issue: str) -> None:
    """Say plainly that a command has not landed yet and exit non-zero."""
    click.echo(f"qtool: '{command}' is not implemented yet ({issue}); nothing was written.", err=True)
    sys.exit(3)
