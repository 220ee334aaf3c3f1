"""`triage gateway`: an OpenAI-compatible HTTP front door for tenants that do not speak
Kafka (docs/gateway.md)."""
