"""Logging set-up shared by the three components, so their logs read alike.

Logs are JSON lines by default, one object per record (time, level, logger, message, and
the job, pod, node or reservation a record is about when the caller passes them with
`extra=`), which is what log pipelines in a cluster expect. BERTH_LOG_FORMAT=text gives
plain lines for a terminal.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTEXT = ("job", "pod", "node", "reservation")


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({key: getattr(record, key) for key in CONTEXT if hasattr(record, key)})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup() -> None:
    handler = logging.StreamHandler()
    if os.environ.get("BERTH_LOG_FORMAT", "json") == "text":
        handler.setFormatter(logging.Formatter(FORMAT))
    else:
        handler.setFormatter(JSONFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
