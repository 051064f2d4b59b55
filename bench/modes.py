"""What Berth's two scopes change, as the bench applies them to its own schedulers and to
the webhook's configuration.

- **default**: kube-scheduler calls the extender only for pods that request
  `berth.sh/reservation` (`managedResources`, `ignoredByScheduler: true`), and the API
  server calls the webhook only in namespaces labelled `berth.sh/migrating`;
- **strict**: the extender sees every pod, the webhook every namespace but the system
  ones; kube-scheduler's NodeResourcesFit is told to ignore `berth.sh/reservation`
  (no managedResources entry says it), which placeholders request.

The functions below take each scope's settings from devtools' rendering, the one
`berth dev up --scope` uses, so the bench measures what a cluster runs.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import yaml

from berth.api import keys
from devtools import render
from devtools.cluster import BERTH_NAMESPACE, LocalCluster

Mode = Literal["default", "strict"]
MODES: tuple[Mode, ...] = ("default", "strict")

MIGRATING_LABEL = keys.MIGRATING_LABEL
SYSTEM_NAMESPACES = ("kube-system", BERTH_NAMESPACE)


def _cluster_entries(cluster: LocalCluster) -> list[dict[str, Any]]:
    """Berth's entries in the cluster's own kube-scheduler config (in the state directory)."""
    config = yaml.safe_load((cluster.state_dir / "kube-scheduler.yaml").read_text())
    extender = next(c for c in cluster.running() if c.name == "berth-extender")
    return [
        e for e in config.get("extenders") or [] if e["urlPrefix"].endswith(f":{extender.port}")
    ]


def cluster_mode(cluster: LocalCluster) -> Mode:
    """The scope `berth dev up` gave the running cluster: is the filter scoped?"""
    [filtering] = [e for e in _cluster_entries(cluster) if e.get("filterVerb")]
    return "default" if filtering.get("managedResources") else "strict"


def extender_entries(cluster: LocalCluster, mode: Mode) -> list[dict[str, Any]]:
    """Berth's entries in kube-scheduler's `extenders`, in `mode`, as `berth dev up
    --scope` renders them for the cluster's extender."""
    entry = _cluster_entries(cluster)[0]
    return render.berth_extenders(
        url=entry["urlPrefix"],
        ca_bundle=(entry.get("tlsConfig") or {}).get("caData"),
        scope=render.Scope(mode),
    )


def webhook_configuration(
    cluster: LocalCluster,
    mode: Mode,
    *,
    skip: tuple[str, ...] = (),
    urls: list[str] | None = None,
) -> dict[str, Any]:
    """Berth's MutatingWebhookConfiguration for the cluster's webhook (or the webhooks at
    `urls`), in `mode`, with `skip` added to the namespaces it never sees (as the system
    ones are)."""
    if urls is None:
        urls = [
            f"https://127.0.0.1:{c.port}/mutate-pod"
            for c in cluster.running()
            if c.name.startswith("berth-webhook")
        ]
    ca = base64.b64encode((cluster.pki / "ca.crt").read_bytes()).decode()
    return render.webhook_configuration(
        urls=urls,
        ca_bundle=ca,
        skip_namespaces=[*SYSTEM_NAMESPACES, *skip],
        scope=render.Scope(mode),
    )


def ignored_resources(mode: Mode) -> list[str]:
    """What kube-scheduler's NodeResourcesFit leaves unchecked in `mode`."""
    return render.ignored_resources(render.Scope(mode))
