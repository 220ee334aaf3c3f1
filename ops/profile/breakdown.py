"""Summarize a py-spy raw (collapsed) profile into the categories of issue 11."""
import sys
from collections import Counter

RULES = [
    ("logging", ("(logging/",)),
    ("outbox commit (librdkafka transaction, thread)", ("outbox.py:2", "KafkaOutbox.publish",)),
    ("table writes + changelog", ("faust/tables/", "faust/stores/", "rocksdict", "_send_changelog",
                                  "aiokafka/producer")),
    ("JSON/pydantic in our handlers",
     ("orjson", "(json/", "pydantic", "model_dump", "model_validate")),
    ("our agents (handlers, core)", ("(triage/streams/", "(triage/admission", "(triage/topics")),
    ("aiokafka fetch/consume", ("aiokafka/",)),
    ("Faust/mode per-event machinery", ("faust/", "mode/")),
    ("event loop", ("asyncio/", "selectors")),
]

def classify(stack: str) -> str:
    frames = stack.split(";")
    # drop the CLI entry frames
    body = ";".join(f for f in frames if "triage/cli" not in f and "triage/__main__" not in f)
    for name, needles in RULES:
        if any(n in body for n in needles):
            return name
    return "other"

def main(path: str) -> None:
    c = Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            if not n.isdigit():
                continue
            c[classify(stack)] += int(n)
            total += int(n)
    print(f"{path}: {total} samples")
    for name, n in c.most_common():
        print(f"  {100*n/total:5.1f}%  {name}")

if __name__ == "__main__":
  for p in sys.argv[1:]:
    main(p)
