"""The CLI's entry points, help and version, and its import cost."""

import json
import subprocess
import sys

import pytest
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


def test_old_option_spellings_still_work_with_a_deprecation_line(work):
    from cli_helpers import invoke

    result = invoke("rewrite-eval", work / "model.onnx", "-o", work / "old.onnx", "--calibration-data",
                    work / "calib.npz")
    assert result.exit_code == 0, result.output
    assert "--calibration-data is deprecated" in result.stderr and "use --data" in result.stderr
    both = invoke("rewrite-eval", work / "model.onnx", "-o", work / "both.onnx", "--calibration-data",
                  work / "calib.npz", "--data", work / "calib.npz")
    assert both.exit_code == 2 and "not both" in both.stderr
    old = invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", work / "r.json",
                 "--method", "percentile")
    assert old.exit_code == 0 and "--method is deprecated" in old.stderr and "percentile" in old.stdout


@pytest.mark.parametrize("args, message", [
    (["--data", "calib.npz", "--percentile", "99"], "--percentile is for --calibration-method percentile"),
    (["--data", "calib.npz", "--calibration-method", "ema", "--num-bins", "512"], "--num-bins is for"),
    (["--data", "calib.npz", "--ema-decay", "0.5", "--calibration-method", "entropy"], "--ema-decay is for"),
    (["--calibration-method", "entropy"], "need calibration data"),
])
def test_options_that_would_be_ignored_are_errors(work, args, message):
    from cli_helpers import invoke

    args = [str(work / a) if a.endswith(".npz") else a for a in args]
    result = invoke("rewrite-eval", work / "model.onnx", "-o", work / "out.onnx", *args)
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
    assert not (work / "out.onnx").exists()


def test_json_is_a_flag_or_a_file_in_every_command(work):
    from cli_helpers import invoke

    flag = invoke("rewrite-eval", work / "model.onnx", "-o", work / "a.onnx", "--data", work / "calib.npz", "--json")
    assert json.loads(flag.stdout)["counts"]["batch_norms_folded"] == 4
    into = invoke("rewrite-eval", work / "model.onnx", "-o", work / "b.onnx", "--data", work / "calib.npz",
                  "--json", work / "summary.json")
    assert "qtool rewrite-eval:" in into.stdout  # the text, and the JSON in the file
    assert json.loads((work / "summary.json").read_text())["counts"]["batch_norms_folded"] == 4
    cal = invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", work / "r.json", "--json")
    assert json.loads(cal.stdout)["tensors"] > 0


def test_progress_is_one_line_per_stage_when_not_on_a_terminal(work):
    from cli_helpers import invoke

    result = invoke("rewrite-eval", work / "model.onnx", "-o", work / "p.onnx", "--data", work / "calib.npz")
    assert "qtool rewrite-eval: calibrating (100 samples)" in result.stderr
    assert "qtool rewrite-eval: done in" in result.stderr


def test_the_command_list_of_help_matches_each_commands_own_help():
    from qtool.cli import COMMANDS

    for name, (module, attr, short) in COMMANDS.items():
        command = getattr(__import__(module, fromlist=[attr]), attr)
        assert command.name == name
        assert command.get_short_help_str(limit=70) == short, name


def test_scope_that_matches_no_node_fails_with_the_closest_names(work):
    from cli_helpers import invoke

    result = invoke("rewrite-eval", work / "model.onnx", "-o", work / "s.onnx", "--scope", "Conv_9")
    assert result.exit_code == 2 and "matches no node" in result.stderr and "closest: 'Conv_" in result.stderr
    assert not (work / "s.onnx").exists()


def test_docs_cli_md_is_the_generated_options_table():
    from pathlib import Path

    from qtool.cli._docs import render

    doc = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
    assert doc.read_text() == render(), "regenerate: python -m qtool.cli._docs > docs/cli.md"
