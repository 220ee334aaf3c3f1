"""`triage schema`: the JSON Schema documents of the wire messages (docs/schema.md)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from triage.cli.common import ExitCode, fail
from triage.topics.messages import ALL_MESSAGES, SCHEMA_VERSION, json_schema_document


def register(app: typer.Typer) -> None:
    app.command("schema")(schema)


def schema(
    message: str | None = typer.Argument(
        None, help=f"One message name ({', '.join(ALL_MESSAGES)}); all when omitted."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o",
        help="Write one document per message to DIR/NAME.schema.json (for a schema registry).",
    ),
) -> None:
    """Print JSON Schema documents of triage's messages, so producers in any language can
    validate: one registrable document per message, with $schema (draft 2020-12) and $id
    (urn:triage:schema:NAME:vN). Without MESSAGE: an object of all of them by name."""
    if message is not None and message not in ALL_MESSAGES:
        raise fail(f"unknown message {message!r}; choose one of {', '.join(ALL_MESSAGES)}",
                   ExitCode.USAGE)  # fmt: skip
    names = [message] if message is not None else list(ALL_MESSAGES)
    docs = {name: json_schema_document(name) for name in names}
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            for name, doc in docs.items():
                (out / f"{name}.schema.json").write_text(json.dumps(doc, indent=2) + "\n")
        except OSError as exc:
            raise fail(f"--out {out}: cannot write: {exc.strerror or exc}",
                       ExitCode.USAGE) from None  # fmt: skip
        typer.echo(f"wrote {len(docs)} schema document(s), version {SCHEMA_VERSION}, to {out}")
        return
    typer.echo(json.dumps(docs[message] if message is not None else docs, indent=2))
