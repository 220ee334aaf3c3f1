"""`triage schema`: print the JSON Schema of every wire message."""

from __future__ import annotations

import json

import typer

from triage.topics.messages import ALL_MESSAGES, json_schemas


def register(app: typer.Typer) -> None:
    app.command("schema")(schema)


def schema(
    message: str = typer.Argument(
        None, help=f"One message name ({', '.join(ALL_MESSAGES)}); all when omitted."
    ),
) -> None:
    """Print JSON Schemas of triage's messages, so producers in any language can validate."""
    schemas = json_schemas()
    if message is not None:
        if message not in schemas:
            raise typer.BadParameter(
                f"unknown message {message!r}; choose one of {', '.join(schemas)}",
                param_hint="MESSAGE",
            )
        typer.echo(json.dumps(schemas[message], indent=2))
        return
    typer.echo(json.dumps(schemas, indent=2))
