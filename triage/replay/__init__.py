"""`triage replay`: recorded traffic under a candidate policy, in virtual time.

Recorded requests (Kafka topics or a decisions export) go through the simulator,
which drives the same admission core as the app; the replayed decisions are then
compared, request by request, with the recorded ones. Nothing here decides.
"""

from triage.replay.diff import ReplayReport, compare
from triage.replay.errors import ReplayError, ReplaySourceError
from triage.replay.export_file import read_export, write_export
from triage.replay.kafka_source import read_kafka
from triage.replay.recording import RecordedRequest, Recording
from triage.replay.runner import ReplayRun, replay

__all__ = [
    "RecordedRequest",
    "Recording",
    "ReplayError",
    "ReplayReport",
    "ReplayRun",
    "ReplaySourceError",
    "compare",
    "read_export",
    "read_kafka",
    "replay",
    "write_export",
]
