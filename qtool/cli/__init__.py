"""The ``qtool`` command line: parse options, call :mod:`qtool.api`, print.

No logic lives here. Each command's module (and with it ``qtool.api``,
numba, onnx and onnxruntime) is imported only when that command runs:
``COMMANDS`` maps a command name to its module, its click command and the
one-line help ``qtool --help`` lists (a test keeps it equal to the
command's own), so ``qtool --help`` stays instant.
"""

from __future__ import annotations

import importlib

import click

from qtool import __version__
from qtool.cli._common import QtoolGroup

# name -> (module, click command object, short help for `qtool --help`)
COMMANDS = {
    "rewrite-train": ("qtool.cli.rewrite", "rewrite_train_cmd",
                      "Write a quantization-aware training graph (tf.contrib.quantize..."),
    "rewrite-eval": ("qtool.cli.rewrite", "rewrite_eval_cmd",
                     "Fold batch norms, insert QuantizeLinear/DequantizeLinear and write..."),
    "simulate": ("qtool.cli.simulate", "simulate_cmd", "Report accuracy and per-tensor error of quantized versions of MODEL."),
    "calibrate": ("qtool.cli.calibrate", "calibrate_cmd",
                  "Run MODEL on --data and write the range of every tensor..."),
    "finetune": ("qtool.cli.finetune", "finetune_cmd",
                 "Train a 'rewrite-train' graph so the quantized model recovers its..."),
}


class LazyGroup(QtoolGroup):
    """Loads a command's module when the command is used, not to list it."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, short) for name, (_, _, short) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="qtool")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors, and onnxruntime's own warnings.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Quantize ONNX models with TensorFlow's quantization rules, bit for bit.

    \b
      qtool rewrite-train model.onnx -o model.qat.onnx
      qtool rewrite-eval  model.onnx -o model.qdq.onnx --data calib.npz
      qtool simulate      model.onnx --data eval.npz --labels labels
      qtool calibrate     model.onnx --data calib.npz -o ranges.json --calibration-method entropy
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    # qtool keeps onnxruntime's log to errors, its process-wide logger too since the process is the CLI's; click has
    # loaded the command's module (and qtool.api) by now
    if debug:
        importlib.import_module("qtool.api").show_onnxruntime_warnings()
    else:
        importlib.import_module("qtool.model.session").own_process_log()
