"""`python -m triage` runs the CLI (the demo starts its processes this way)."""

from triage.lifeline import die_with_parent

die_with_parent()  # before the CLI: a parent killed meanwhile takes this process along

from triage.cli.main import main  # noqa: E402  (after the lifeline, on purpose)

main()
