"""Components log JSON lines that carry what a record is about."""

from __future__ import annotations

import json
import logging

from berth.log import JSONFormatter


def test_json_lines_carry_level_message_and_context() -> None:
    record = logging.LogRecord(
        "controller.app", logging.WARNING, __file__, 1, "evicting %s", ("ns/web-1",), None
    )
    record.job = "mig-1"
    record.pod = "ns/web-1"
    line = json.loads(JSONFormatter().format(record))
    assert line["level"] == "warning"
    assert line["logger"] == "controller.app"
    assert line["message"] == "evicting ns/web-1"
    assert (line["job"], line["pod"]) == ("mig-1", "ns/web-1")
    assert line["time"].endswith("+00:00")
