"""Shared CLI plumbing: error handling and options used by several commands."""

from __future__ import annotations

import sys

import click

from qtool.config import ROUND_MODES, CalibrationConfig, QuantConfig  # a leaf module: no heavy imports
from qtool.errors import QtoolError


class QtoolGroup(click.Group):
    """A click group that turns user errors into one line and a non-zero exit.

    ``--debug`` (anywhere on the command line) shows the traceback instead.
    Usage errors (a bad option value, a missing argument) are one line too,
    naming the command, instead of click's usage block.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if args is None:
            args = sys.argv[1:]
        args = list(args)
        if "--debug" in args[1:]:  # `qtool rewrite-eval ... --debug` works like `qtool --debug ...`
            args = ["--debug"] + [a for a in args if a != "--debug"]
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            where = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "qtool"
            hint = f" (see '{where} --help')" if isinstance(exc, click.UsageError) else ""
            click.echo(f"{where}: error: {exc.format_message()}{hint}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("qtool: aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

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
            if isinstance(exc, OSError):  # the machine's trouble (disk full, permissions), not a bug
                click.echo(f"qtool: error: {exc}", err=True)
                sys.exit(2)
            # anything else is a bug, not a user mistake: say so (a ValueError shown as "error: ..." hid
            # a cyclic training graph); the library maps every user mistake to a QtoolError at its source
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
symmetric_weights_option = click.option(
    "--symmetric-weights/--asymmetric-weights",
    default=True,
    show_default=True,
    help="Weights on a symmetric grid (zero point 0: TFLite's int8 spec, and what onnxruntime's fast integer "
    "kernels need), or TF's asymmetric min/max grid.",
)
per_channel_option = click.option(
    "--per-channel/--per-tensor",
    default=True,
    show_default=True,
    help="Weight ranges per output channel, or one per tensor.",
)
float_rnn_option = click.option(
    "--float-rnn",
    is_flag=True,
    help="Keep LSTMs in float. By default an LSTM runs as onnxruntime's com.microsoft.DynamicQuantizeLSTM "
    "(int8 weights quantized by qtool, activations quantized by the kernel at run time).",
)
standard_ops_option = click.option(
    "--standard-ops",
    is_flag=True,
    help="Write standard ONNX ops only, for runtimes other than onnxruntime: LSTMs stay float (no "
    "com.microsoft.DynamicQuantizeLSTM) and a GELU written out with Erf is not fused into com.microsoft.Gelu.",
)
pack_int4_option = click.option(
    "--pack-int4",
    is_flag=True,
    help="Store 4-bit weights packed as int4 (opset 21): half the file size, but onnxruntime has no integer kernel "
    "for int4 weights and runs those layers in float, 2-3x slower than the float model on CPU. By default 4-bit "
    "weights are stored in int8 and run in onnxruntime's integer kernels.",
)
int8_activations_option = click.option(
    "--int8-activations",
    is_flag=True,
    help="Store activations as int8 (zero point 0 for --symmetric ranges: TensorRT, TFLite's int8 spec) instead "
    "of uint8 on the same grid (a symmetric range: zero point 128). onnxruntime's x86 kernels leave many int8 "
    "Conv/MatMul in float: slower than the float model.",
)
round_mode_option = click.option(
    "--round-mode",
    type=click.Choice(ROUND_MODES),
    default="half_up",
    show_default=True,
    help="How the training graph's FakeQuant and the stored weights round: half_up (TensorFlow's FakeQuant) or "
    "half_to_even (what QuantizeLinear computes, so the deployed model's activations round as trained). "
    "The eval graph's activations always round half to even (QuantizeLinear).",
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
json_option = click.option(
    "--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
    help="The summary as JSON: on stdout (instead of the text), or into FILE (with the text on stdout).",
)
DATA_HELP = (".npz with one array per model input (first axis = samples), a .npy for a one-input model, or a folder "
             "of such files (samples of different dynamic shapes; see docs/calibration.md).")
DATA_PATH = click.Path()  # a file or a folder
data_option = click.option("--data", "data", type=DATA_PATH, default=None,
                           help="Calibration data: " + DATA_HELP)
calibration_data_option = click.option(
    "--calibration-data",
    type=DATA_PATH,
    default=None,
    help=DATA_HELP,
)


def deprecated_alias(old: str, new: str, dest: str, **option):
    """A hidden option ``old`` kept for a release: it warns and fills ``dest`` (the option ``new``)."""

    def callback(ctx: click.Context, param, value):
        if value is None or value is False:
            return value
        click.echo(f"qtool: warning: {old} is deprecated and will be removed; use {new}", err=True)
        ctx.meta.setdefault("qtool.aliases", {})[dest] = (old, new, value)
        return value

    return click.option(old, f"alias_{dest}", hidden=True, default=None, expose_value=False, callback=callback,
                        **option)


def apply_aliases(ctx: click.Context, params: dict) -> None:
    """Fill each option from its deprecated alias (one spelling at a time)."""
    for dest, (old, new, value) in ctx.meta.get("qtool.aliases", {}).items():
        if ctx.get_parameter_source(dest) == click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError(f"give {new} or {old}, not both")
        params[dest] = value


# options that only one calibration method reads: given for another method, they would be ignored
METHOD_OPTIONS = {"percentile": ("percentile", "auto"), "num_bins": ("percentile", "entropy", "mse", "auto"),
                  "ema_decay": ("ema",)}


def check_method_options(ctx: click.Context, method: str) -> None:
    """``--percentile`` without the percentile method (and the like) is an error, never ignored."""
    for name, methods in METHOD_OPTIONS.items():
        if method not in methods and ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            flag = "--" + name.replace("_", "-")
            raise click.UsageError(f"{flag} is for --calibration-method {' or '.join(methods)}, not {method}")


def given(ctx: click.Context, name: str) -> bool:
    """The option was given on the command line (not left at its default)."""
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
batch_size_option = click.option(
    "--batch-size", type=click.IntRange(1), default=16, show_default=True, help="Samples per inference batch."
)


# --- calibration methods (rewrite-eval, rewrite-train initial ranges, calibrate) -------------
CALIBRATION_METHODS = ("minmax", "ema", "percentile", "entropy", "mse")


def calibration_method_option(name: str = "--calibration-method", auto: bool = False):
    return click.option(
        name,
        "calibration_method",
        type=click.Choice(CALIBRATION_METHODS + (("auto",) if auto else ())),
        default="minmax",
        show_default=True,
        help="How activation ranges are chosen: min/max over all data; TF's moving average of batch min/max; "
        "a percentile of a histogram; TensorRT's KL-divergence threshold; the range with the least "
        "fake-quantization MSE" + ("; auto: the model written with each of minmax, percentile and mse "
                                   "(one histogram pass), the one whose outputs on the first calibration samples "
                                   "are closest to float's kept" if auto else "") + ". See docs/calibration.md.",
    )


percentile_option = click.option(
    "--percentile",
    type=click.FloatRange(0, 100, min_open=True),
    default=99.999,
    show_default=True,
    help="percentile method: keep this percentage of the values ((100-P)/2 cut on each side).",
)
num_bins_option = click.option(
    "--num-bins",
    type=click.IntRange(16),
    default=2048,
    show_default=True,
    help="percentile/entropy/mse: histogram resolution (the observed range spans at least N bins).",
)
ema_decay_option = click.option(
    "--ema-decay",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.999,
    show_default=True,
    help="ema method: decay of the moving average (one step per batch).",
)


def calibration_options(f=None, *, auto: bool = False):
    """``--calibration-method``, ``--percentile``, ``--num-bins``, ``--ema-decay`` in one decorator
    (``auto=True``: the method ``auto`` too, which only rewrite-eval can run: it checks what it writes)."""
    def decorate(f):
        for option in reversed((calibration_method_option(auto=auto), percentile_option, num_bins_option,
                                ema_decay_option)):
            f = option(f)
        return f
    return decorate if f is None else decorate(f)


def quantization_options(f):
    """The options that decide what is quantized and how: ``QuantConfig``'s fields."""
    exclude = click.option("--exclude", multiple=True, metavar="NODE_NAME",
                           help="Keep this node in float (repeatable).")
    for option in reversed((weight_bits_option, activation_bits_option, symmetric_option, symmetric_weights_option,
                            per_channel_option, float_rnn_option, scope_option, exclude)):
        f = option(f)
    return f


def quant_config(params: dict):
    """``QuantConfig`` from the parsed ``quantization_options`` (popped from ``params``)."""
    return QuantConfig(params.pop("weight_bits"), params.pop("activation_bits"), params.pop("symmetric"),
                       params.pop("per_channel"), params.pop("scope"), params.pop("exclude"),
                       params.pop("symmetric_weights"), params.pop("float_rnn"), params.pop("round_mode", "half_up"),
                       params.pop("standard_ops", False), params.pop("pack_int4", False),
                       params.pop("int8_activations", False))


def calibration_config(params: dict):
    """``CalibrationConfig`` from the parsed ``calibration_options`` and ``--batch-size`` (popped)."""
    return CalibrationConfig(params.pop("calibration_method"), params.pop("batch_size"),
                             params.pop("percentile"), params.pop("num_bins"), params.pop("ema_decay"))


latency_option = click.option(
    "--latency", "latency_rounds", type=click.IntRange(1), default=None, metavar="ROUNDS", is_flag=False,
    flag_value=100, help="Also time the float and quantized models in onnxruntime (one thread, batch 1, "
                         "interleaved, median thread CPU time of ROUNDS runs, 100 when no number is given): what "
                         "int8 buys.")
verbose_option = click.option("-v", "--verbose", is_flag=True, help="Also the notes (the same advice every run).")


class ProgressBars:
    """Click progress bars on stderr, one per pass over the data; off when stderr
    is not a terminal (or for ``--json``).

    ``update(label, done, total)`` starts a new bar when the label changes;
    ``calibration`` is the ``progress(done, total)`` callback of the calibration
    runner.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.label = None
        self.bar = None
        self.done = 0

    def update(self, label: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if label != self.label or done < self.done:  # a new pass (an If branch's calibration)
            self.close()
            self.label = label
            self.bar = click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True)
            self.bar.__enter__()
            self.done = 0
        self.bar.update(done - self.done)
        self.done = done

    def calibration(self, done: int, total: int) -> None:
        self.update("calibrating", done, total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
        self.label = None
