"""What Berth's two scopes change, as the bench applies them to its own schedulers and to
the webhook's configuration.

- **default**: kube-scheduler calls the extender only for pods that request
  `berth.sh/reservation` (`managedResources`, `ignoredByScheduler: true`), and the API
  server calls the webhook only in namespaces labelled `berth.sh/migrating`;
- **strict**: the extender sees every pod, the webhook every namespace but the system
  ones; kube-scheduler's NodeResourcesFit is told to ignore `berth.sh/reservation`
  (no managedResources entry says it), which placeholders request.

The functions below are the only place the bench spells a scope out, the same way
devtools renders `berth dev up --scope`; point them at devtools' own rendering per scope
once it has one (`render.berth_extender`, `render.webhook_configuration(scope=...)`,
`render.ignored_resources`).
"""

from __future__ import annotations

import base64
import copy
from typing import Any, Literal

import yaml

from devtools import render
from devtools.cluster import BERTH_NAMESPACE, LocalCluster

Mode = Literal["default", "strict"]
MODES: tuple[Mode, ...] = ("default", "strict")

RESERVATION_RESOURCE = "berth.sh/reservation"
MIGRATING_LABEL = "berth.sh/migrating"
SYSTEM_NAMESPACES = ("kube-system", BERTH_NAMESPACE)


def _cluster_entry(cluster: LocalCluster) -> dict[str, Any]:
    """Berth's entry in the cluster's own kube-scheduler config (in the state directory)."""
    config = yaml.safe_load((cluster.state_dir / "kube-scheduler.yaml").read_text())
    extender = next(c for c in cluster.running() if c.name == "berth-extender")
    entry: dict[str, Any] = next(
        e for e in config.get("extenders") or [] if e["urlPrefix"].endswith(f":{extender.port}")
    )
    return entry


def cluster_mode(cluster: LocalCluster) -> Mode:
    """The scope `berth dev up` gave the running cluster."""
    return "default" if _cluster_entry(cluster).get("managedResources") else "strict"


def extender_entry(cluster: LocalCluster, mode: Mode) -> dict[str, Any]:
    """Berth's entry in kube-scheduler's `extenders`, in `mode`: the one `berth dev up`
    gave the cluster's own kube-scheduler, with the scope's managedResources."""
    entry = copy.deepcopy(_cluster_entry(cluster))
    entry.pop("managedResources", None)
    if mode == "default":
        entry["managedResources"] = [{"name": RESERVATION_RESOURCE, "ignoredByScheduler": True}]
    return entry


def webhook_configuration(
    cluster: LocalCluster, mode: Mode, *, skip: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Berth's MutatingWebhookConfiguration for the cluster's webhook, in `mode`, with
    `skip` added to the namespaces it never sees (as the system ones are)."""
    urls = [
        f"https://127.0.0.1:{c.port}/mutate-pod"
        for c in cluster.running()
        if c.name.startswith("berth-webhook")
    ]
    ca = base64.b64encode((cluster.pki / "ca.crt").read_bytes()).decode()
    config = render.webhook_configuration(
        urls=urls, ca_bundle=ca, skip_namespaces=[*SYSTEM_NAMESPACES, *skip]
    )
    if mode == "default":
        for webhook in config["webhooks"]:
            webhook["namespaceSelector"]["matchExpressions"].append(
                {"key": MIGRATING_LABEL, "operator": "In", "values": ["true"]}
            )
    return config


def ignored_resources(mode: Mode) -> list[str]:
    """What kube-scheduler's NodeResourcesFit leaves unchecked in `mode`."""
    return [RESERVATION_RESOURCE] if mode == "strict" else []
