"""The ``qtool`` command line: parse options, call the library, print.

No logic lives here, and nothing heavy is imported at module level: numba,
onnx and onnxruntime are imported by the library functions a command calls,
so ``qtool --help`` stays instant.
"""

from __future__ import annotations

import click

from qtool import __version__
from qtool.cli._common import QtoolGroup
from qtool.cli.calibrate import calibrate_cmd
from qtool.cli.finetune import finetune_cmd
from qtool.cli.rewrite import rewrite_eval_cmd, rewrite_train_cmd
from qtool.cli.simulate import simulate_cmd


@click.group(cls=QtoolGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="qtool")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Quantize ONNX models with TensorFlow's quantization rules, bit for bit.

    \b
      qtool rewrite-train model.onnx -o model.qat.onnx
      qtool rewrite-eval  model.onnx -o model.qdq.onnx --calibration-data calib.npz
      qtool simulate      model.onnx --data eval.npz --labels labels
      qtool calibrate     model.onnx --data calib.npz -o ranges.json --method entropy
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


main.add_command(rewrite_train_cmd)
main.add_command(rewrite_eval_cmd)
main.add_command(simulate_cmd)
main.add_command(calibrate_cmd)
main.add_command(finetune_cmd)
