"""`triage demo`: the whole system on the local broker, driven by the seed's three tenants."""
