# The triage image for docker-compose.yml: the CLI and its runtime deps.
# (The local Kafka broker of `triage kafka` is not used here: Compose runs apache/kafka.)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY triage ./triage
RUN pip install . \
    && useradd --create-home --uid 10001 triage \
    && mkdir -p /var/lib/triage \
    && chown triage /var/lib/triage

USER triage
WORKDIR /var/lib/triage
CMD ["triage", "--help"]
