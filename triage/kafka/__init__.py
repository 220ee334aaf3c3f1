"""Kafka client helpers (confluent-kafka) and the local broker manager."""
