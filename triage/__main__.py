"""`python -m triage` runs the CLI (the demo starts its processes this way)."""

from triage.cli.main import main

main()
