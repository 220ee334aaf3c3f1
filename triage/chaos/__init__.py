"""The fault suite: the real system on loopback, faults injected, answers counted."""
