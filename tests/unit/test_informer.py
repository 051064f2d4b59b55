"""The informer's cache takes this process's own writes: newer versions only, never older."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from berth.kube.client import PODMIGRATIONJOBS, Kube
from berth.kube.informer import Informer


def version(rv: str, *, phase: str, uid: str = "uid-1") -> dict[str, Any]:
    return {
        "metadata": {"name": "job-1", "uid": uid, "resourceVersion": rv},
        "status": {"phase": phase},
    }


def cache() -> tuple[Informer, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    informer = Informer(
        cast(Kube, None),
        PODMIGRATIONJOBS,
        indexes={"phase": lambda o: [o["status"]["phase"]]},
        handler=lambda kind, obj: seen.append((kind, obj["metadata"]["resourceVersion"])),
    )
    asyncio.run(informer._apply("ADDED", version("10", phase="Pending")))
    return informer, seen


def test_an_own_write_is_seen_at_once_and_its_event_still_reaches_the_handler() -> None:
    informer, seen = cache()
    informer.assume(version("12", phase="Running"))
    assert informer.get("job-1") == version("12", phase="Running")
    assert [o["metadata"]["name"] for o in informer.by_index("phase", "Running")] == ["job-1"]
    assert informer.by_index("phase", "Pending") == []
    # A watch event older than the write does not take the cache back; the write's own
    # event does reach the handler.
    asyncio.run(informer._apply("MODIFIED", version("11", phase="Pending")))
    asyncio.run(informer._apply("MODIFIED", version("12", phase="Running")))
    assert informer.get("job-1") == version("12", phase="Running")
    assert seen == [("ADDED", "10"), ("MODIFIED", "12")]


def test_what_is_not_newer_is_not_assumed() -> None:
    informer, _ = cache()
    for stale in (
        version("9", phase="Running"),
        version("10", phase="Running"),
        version("12", phase="Running", uid="uid-2"),
        version("", phase="Running"),
    ):
        informer.assume(stale)
        assert informer.get("job-1") == version("10", phase="Pending")
    informer.assume({"metadata": {"name": "job-2", "uid": "u", "resourceVersion": "20"}})
    assert informer.get("job-2") is None  # no version seen yet: left to the watch


def created(name: str, rv: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": rv},
        "status": {"phase": "Pending"},
    }


def test_an_object_just_created_is_seen_at_once_until_the_watch_passed_it() -> None:
    """Its creation is not yet in the watch: the cache takes it (so that the next pass
    does not create it again). Past it, the watch has said what became of it (here: it
    was deleted before the create's response came), so it is not brought back."""
    informer, _ = cache()
    informer.resource_version = "15"
    informer.assume(created("job-2", "20"))
    assert informer.get("job-2") == created("job-2", "20")
    informer.assume(created("job-3", "14"))
    assert informer.get("job-3") is None
