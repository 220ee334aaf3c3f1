"""`triage audit`: answer "why was my request rejected?" from the decisions log."""

from triage.audit.errors import AuditError, DecisionSourceError, InvalidSinceError, NoDecisionsError
from triage.audit.explain import ExplainedDecision, Explanation, explain
from triage.audit.reader import ScanResult, parse_since, read_decisions, read_decisions_file
from triage.audit.sentences import SENTENCES, sentence

__all__ = [
    "SENTENCES",
    "AuditError",
    "DecisionSourceError",
    "ExplainedDecision",
    "Explanation",
    "InvalidSinceError",
    "NoDecisionsError",
    "ScanResult",
    "explain",
    "parse_since",
    "read_decisions",
    "read_decisions_file",
    "sentence",
]
