"""The fake nodes' wait: its budget, what counts as schedulable, and what it reports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from devtools import nodes

NOT_READY = "node.kubernetes.io/not-ready"


def node(name: str, *, ready: str | None = "True", taints: Sequence[str] = ()) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": ready}] if ready else []
    return {
        "metadata": {"name": name},
        "spec": {"taints": [{"key": key, "effect": "NoSchedule"} for key in taints]},
        "status": {"conditions": conditions},
    }


def test_the_wait_grows_with_the_node_count() -> None:
    small, large, larger = (nodes.wait_budget(n) for n in (3, 2000, 5000))
    assert nodes.BASE_WAIT <= small < nodes.BASE_WAIT + 1
    assert small < large < larger
    assert larger - large == 3000 * nodes.PER_NODE_WAIT


def test_a_node_is_schedulable_once_ready_and_no_longer_tainted_not_ready() -> None:
    assert nodes.is_schedulable(node("a"))
    assert not nodes.is_schedulable(node("a", taints=[NOT_READY]))
    assert not nodes.is_schedulable(node("a", taints=["node.kubernetes.io/unreachable"]))
    assert not nodes.is_schedulable(node("a", ready="False"))
    assert not nodes.is_schedulable(node("a", ready=None))
    # A taint of the user's own does not make the node any less started.
    assert nodes.is_schedulable(node("a", taints=["dedicated"]))
    assert nodes.is_schedulable({"metadata": {"name": "a"}, "status": node("a")["status"]})


def test_tally_counts_only_the_wanted_nodes_by_stage() -> None:
    cluster = {
        "n0": node("n0"),
        "n1": node("n1", taints=[NOT_READY]),
        "n2": node("n2", ready=None, taints=[NOT_READY]),
        "other": node("other"),
    }
    count = nodes.tally(["n0", "n1", "n2", "n3"], cluster)
    assert count == nodes.Tally(wanted=4, created=3, ready=2, schedulable=1)
    assert not count.done
    assert count.line(12.4) == "nodes: 3/4 created, 2/4 Ready, 1/4 schedulable (12s)"
    assert nodes.tally(["n0", "other"], cluster).done


def test_missing_names_each_stage_and_who_completes_it() -> None:
    cluster = {
        "n1": node("n1", taints=[NOT_READY]),
        "n2": node("n2", ready="False", taints=[NOT_READY]),
        "n4": node("n4"),
    }
    text = nodes.missing(["n1", "n2", "n3", "n4"], cluster)
    assert text.startswith("1 not created (n3); 1 not Ready, which kwok makes them (n2); ")
    assert "1 Ready but still tainted not-ready" in text
    assert "kube-controller-manager" in text
    assert text.endswith("(n1)")
    assert nodes.missing(["n4"], cluster) == ""


def test_sample_names_a_few_and_counts_the_rest() -> None:
    assert nodes.sample([]) == ""
    assert nodes.sample(["a", "b"]) == "a, b"
    assert nodes.sample([f"n{i}" for i in range(8)], shown=3) == "n0, n1, n2 and 5 more"


def test_progress_is_due_at_most_once_per_period() -> None:
    throttle = nodes.Throttle(2.0, start=100.0)
    assert not throttle.due(101.9)
    assert throttle.due(102.0)
    assert not throttle.due(103.5)
    assert throttle.due(104.1)
    assert throttle.due(200.0)
