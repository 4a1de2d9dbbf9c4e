"""docs/cli.md, generated from the click definitions: ``python -m qtool.cli._docs > docs/cli.md``.

One table: every option of every command, so the same concept visibly has one
spelling everywhere (a test keeps the file equal to this output).
"""

from __future__ import annotations

import importlib

import click

from qtool.cli import COMMANDS

HEADER = """# The command line

Generated from the click definitions (`python -m qtool.cli._docs > docs/cli.md`; a test keeps it
current). One spelling per concept in every command: `--data` is the data a command runs the model
on (`simulate --calibration-data` is the what-if table's separate calibration data), `--json [FILE]`
prints the summary as JSON on stdout, or writes it to FILE next to the text. Old spellings
(`--calibration-data` in the rewrites, `--method` in `calibrate`) still work for a release and print
a deprecation line.
"""


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\\\|")


def option_rows(command: click.Command) -> list[str]:
    rows = []
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        names = ", ".join(f"`{o}`" for o in param.opts + param.secondary_opts)
        default = param.default
        if isinstance(default, bool) and param.secondary_opts:  # --a/--b: the one on by default
            default = f"`{(param.opts if default else param.secondary_opts)[0]}`"
        elif isinstance(default, (int, float, str)) and not isinstance(default, bool):
            default = f"`{default}`"
        else:
            default = ""
        rows.append(f"| {names} | {_cell(param.help or '')} | {default} |")
    return rows


def render() -> str:
    parts = [HEADER]
    for name, (module, attr, _) in COMMANDS.items():
        command = getattr(importlib.import_module(module), attr)
        args = " ".join(p.name.upper() for p in command.params if isinstance(p, click.Argument))
        parts.append(f"\n## `qtool {name} {args}`\n\n{_cell(command.get_short_help_str(limit=200))}\n")
        parts.append("| option | meaning | default |\n|---|---|---|")
        parts.extend(option_rows(command))
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(render(), end="")
