"""Plumbing: structured logging, one line per record with `key=value` fields."""

from __future__ import annotations

import logging
import sys
from typing import Any


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = f"{self.formatTime(record)} {record.levelname} {record.name}: {record.getMessage()}"
        fields: dict[str, Any] = getattr(record, "fields", {})
        if fields:
            base += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info:
            base += "\n" + self.formatException(record.exc_info)
        return base


def setup_logging(level: str, service: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("nats").setLevel(logging.WARNING)
    logging.getLogger(service).debug("logging ready")


def kv(**fields: Any) -> dict[str, Any]:
    """`log.info("cycle", extra=kv(placed=3))` attaches structured fields."""
    return {"fields": fields}
