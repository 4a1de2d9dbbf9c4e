"""The CLI's entry points, help and version, and its import cost."""

import subprocess
import sys

from click.testing import CliRunner

import qtool
from qtool.cli import main


def test_help_lists_every_command():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for command in ("rewrite-train", "rewrite-eval", "simulate"):
        assert command in result.output


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert qtool.__version__ in result.output


def test_python_dash_m_qtool_runs_the_cli():
    proc = subprocess.run([sys.executable, "-m", "qtool", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "rewrite-eval" in proc.stdout


def test_cli_import_path_stays_free_of_heavy_modules():
    # `qtool --help` must be instant: numba, onnx, onnx_ir and onnxruntime load only when a command runs
    code = (
        "import sys, qtool.cli\n"
        "from click.testing import CliRunner\n"
        "CliRunner().invoke(qtool.cli.main, ['--help'])\n"
        "for c in qtool.cli.main.commands: CliRunner().invoke(qtool.cli.main, [c, '--help'])\n"
        "heavy = [m for m in ('numba', 'onnx', 'onnx_ir', 'onnxruntime', 'numpy') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def test_every_command_has_help_text():
    for name, command in main.commands.items():
        result = CliRunner().invoke(main, [name, "--help"])
        assert result.exit_code == 0, name
        assert command.help and len(command.help) > 20


def test_lazy_top_level_api_names_resolve():
    for name in ("fake_quant_with_min_max_vars", "quantize_and_dequantize_v2", "nudged_range", "rewrite_eval"):
        assert callable(getattr(qtool, name))
