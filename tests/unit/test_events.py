"""The event recorder never raises: an Event it cannot write is logged."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from berth.kube.client import Kube
from berth.kube.events import NOTE_LIMIT, Recorder, note
from tests.unit.test_cli_errors import kubeconfig_to_a_closed_port


async def test_an_api_server_out_of_reach_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kube = await Kube.connect(kubeconfig_to_a_closed_port(tmp_path))
    try:
        recorder = Recorder(kube, component="berth-test", instance="test")
        pod = {"kind": "Pod", "metadata": {"namespace": "ns", "name": "web", "uid": "u"}}
        with caplog.at_level(logging.WARNING, logger="berth.kube.events"):
            await recorder.record(pod, "Reason", "told")
        assert "could not record event Reason" in caplog.text
        assert recorder.told == {}  # not written: told anew next time
    finally:
        await kube.close()


def test_a_note_is_cut_at_what_an_event_holds() -> None:
    assert note("x" * NOTE_LIMIT) == "x" * NOTE_LIMIT
    assert note("x" * (NOTE_LIMIT + 1)) == "x" * (NOTE_LIMIT - 3) + "..."


def test_a_note_is_cut_at_the_bytes_an_event_holds() -> None:
    """The API server counts the bytes of the message: a cut never splits a character."""
    message = "é" * NOTE_LIMIT  # two bytes each
    cut = note(message)
    assert len(cut.encode()) <= NOTE_LIMIT
    assert cut.endswith("...")
    assert cut[:-3] == "é" * ((NOTE_LIMIT - 3) // 2)
