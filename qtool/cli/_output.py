"""Writing a command's result: text, JSON on stdout, or a JSON file (``--json [FILE]``).

Apart from ``_common`` (imported by ``qtool --help``) because it needs the model floor's writer.
"""

from __future__ import annotations

import json

import click

from qtool.model.io import write_text


def print_result(result, json_out: str | None, verbose: bool = False) -> None:
    """Warnings on stderr, then the summary: text, JSON on stdout (``--json``), or the text and a JSON
    file (``--json FILE``). Notes (the same advice each run) are shown with ``--verbose`` only."""
    summary = result.to_dict()
    for warning in summary.get("warnings", []):
        click.echo(f"qtool: warning: {warning}", err=True)
    if json_out == "-":
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    if json_out is not None:
        write_json(json_out, summary)
    text = result.format_text()
    if not verbose:
        text = "\n".join(line for line in text.splitlines() if not line.startswith("  note: "))
        if summary.get("notes"):
            text += f"\n  ({len(summary['notes'])} note(s): --verbose shows them)"
    click.echo(text)


def write_json(path: str, document: dict) -> None:
    """A JSON summary written atomically (``--json FILE``)."""
    write_text(path, json.dumps(document, indent=2, default=str) + "\n")
