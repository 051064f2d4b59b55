"""The files the local control plane reads: kubeconfigs, scheduler config, fake nodes.

Pure functions from settings to YAML-ready dicts, kept apart from process handling.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from berth.api import keys
from berth.protocol import controller_users
from berth.settings import DEFAULT_SCHEDULER_NAMES

# kwok manages exactly the nodes that carry this annotation.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"


class Scope(StrEnum):
    """Which pods pass through Berth's extender and webhook (README, "Scope")."""

    DEFAULT = "default"
    """Only Berth's own: the extender is called for pods requesting Berth's extended
    resource (`managedResources`), the webhook for pod creations in namespaces labelled
    `berth.sh/migrating` (`namespaceSelector`) by a workload controller
    (`matchConditions`)."""
    STRICT = "strict"
    """Every pod, as manifests/strict configures it."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(
    *, server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, name: str = "berth-dev"
) -> dict[str, Any]:
    """A self-contained kubeconfig (certificates embedded) for one user on one cluster."""
    user = {"client-certificate-data": _b64(cert_pem), "client-key-data": _b64(key_pem)}
    return _kubeconfig(
        server=server, ca_pem=ca_pem, user_name=f"{name}-admin", user=user, name=name
    )


def token_kubeconfig(*, server: str, ca_pem: bytes, token: str, user_name: str) -> dict[str, Any]:
    """A kubeconfig that authenticates with a bearer token (a ServiceAccount's)."""
    return _kubeconfig(server=server, ca_pem=ca_pem, user_name=user_name, user={"token": token})


def _kubeconfig(
    *, server: str, ca_pem: bytes, user_name: str, user: dict[str, str], name: str = "berth-dev"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)},
            }
        ],
        "users": [{"name": user_name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user_name}}],
        "current-context": name,
    }


def scheduler_config(
    *,
    kubeconfig_path: Path,
    scheduler_names: Sequence[str] = DEFAULT_SCHEDULER_NAMES,
    extenders: list[dict[str, Any]] | None = None,
    ignored_resources: list[str] | None = None,
    qps: int = 50,
    burst: int = 100,
) -> dict[str, Any]:
    """A KubeSchedulerConfiguration with one profile per name (each with the default
    plugins), optionally HTTP extenders, and extended resources NodeResourcesFit leaves
    unchecked. kube-scheduler gives its extenders to every profile, so each name is
    scheduled with Berth's extender.

    `percentageOfNodesToScore` stays at its default (adaptive: 50% less 1% per 125 nodes,
    at least 5% and 100 nodes): on 2,000 nodes the scheduler stops filtering once it has
    found 680 feasible nodes (34%), and only those are scored and sent to the extenders."""

    def profile(name: str) -> dict[str, Any]:
        if not ignored_resources:
            return {"schedulerName": name}
        return {
            "schedulerName": name,
            "pluginConfig": [
                {"name": "NodeResourcesFit", "args": {"ignoredResources": list(ignored_resources)}}
            ],
        }

    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig_path), "qps": qps, "burst": burst},
        # One scheduler per profile name here: no election, no waiting for a lease.
        "leaderElection": {"leaderElect": False},
        "profiles": [profile(name) for name in scheduler_names],
    }
    if extenders:
        config["extenders"] = extenders
    return config


def berth_extenders(*, url: str, ca_bundle: str | None, scope: Scope) -> list[dict[str, Any]]:
    """The scheduler's extender entries for Berth, as manifests/scheduler (default scope) or
    manifests/strict (strict scope) configure them. Without `ca_bundle`, plain HTTP.

    Default: one entry, every verb, only for pods requesting Berth's extended resource.
    Strict: filter and preempt for every pod, and prioritize in an entry of its own for
    Berth's pods only (the only pods it ranks nodes for that no filter already decides),
    so an ordinary pod costs one round trip, not two."""
    connection: dict[str, Any] = {
        "urlPrefix": url,
        "nodeCacheCapable": True,
        "ignorable": True,
        "httpTimeout": "3s",
    }
    if ca_bundle is not None:
        connection.update(enableHTTPS=True, tlsConfig={"caData": ca_bundle})
    managed = {
        "managedResources": [{"name": keys.RESERVATION_RESOURCE, "ignoredByScheduler": True}]
    }
    verbs = {"filterVerb": "filter", "preemptVerb": "preempt"}
    ranking = {"prioritizeVerb": "prioritize", "weight": 5}
    if scope == Scope.DEFAULT:
        return [{**connection, **verbs, **ranking, **managed}]
    return [{**connection, **verbs}, {**connection, **ranking, **managed}]


def ignored_resources(scope: Scope) -> list[str]:
    """What the scheduler's NodeResourcesFit is told to ignore in the profile itself: in
    the strict scope, Berth's extended resource (requested by placeholders and bound pods,
    advertised by no node). The prioritize entry's managedResources says the same, but
    the filter must not depend on that entry being kept."""
    return [keys.RESERVATION_RESOURCE] if scope == Scope.STRICT else []


def fake_node(*, name: str, cpu: str, memory: str, pods: int) -> dict[str, Any]:
    """A Node object that kwok will keep Ready and whose pods it will run."""
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            # The beta OS and arch labels too, as a kubelet sets them: the node lifecycle
            # controller would otherwise add them with one more write per node.
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "status": {"capacity": resources, "allocatable": resources},
    }


def namespace_selector(*, skip_namespaces: list[str], scope: Scope) -> dict[str, Any]:
    """Which namespaces' pod creations reach the webhook: never the skipped ones, and in
    the default scope only those the controller labelled for a migration."""
    expressions: list[dict[str, Any]] = [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": skip_namespaces}
    ]
    if scope == Scope.DEFAULT:
        expressions.append({"key": keys.MIGRATING_LABEL, "operator": "In", "values": ["true"]})
    return {"matchExpressions": expressions}


def created_by_a_workload_controller() -> dict[str, str]:
    """The webhook's match condition, in both scopes: the API server calls it only for pods
    created as a workload controller, the only pods its decision can bind (webhook/decide.py,
    `berth.protocol.created_by_controller`). `request.userInfo.username` is always a string,
    so the expression cannot fail to evaluate (with failurePolicy Ignore, an error would
    skip the call)."""
    users = ", ".join(f"'{user}'" for user in controller_users())
    return {
        "name": "created-by-a-workload-controller",
        "expression": f"request.userInfo.username in [{users}]",
    }


def kwok_configuration(*, parallelism: int) -> dict[str, Any]:
    """kwok's own settings beside its stages: how many node Leases, node stages and pod
    stages it works on at once. kwok's default of 4 holds new nodes to some 40 a second on
    two cores (each is an API call waiting on a busy API server). kwok fills in its
    defaults only when it is given no KwokConfiguration at all, so this one restates the
    rest of them."""
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "nodeLeaseParallelism": parallelism,
            "nodePlayStageParallelism": parallelism,
            "podPlayStageParallelism": parallelism,
            "podsOnNodeSyncParallelism": 1,
            "enablePodsOnNodeSyncListPager": True,
            "enablePodsOnNodeSyncStreamWatch": False,
            "enableDebuggingHandlers": True,
            "enableProfilingHandler": True,
            "enableContentionProfiling": False,
        },
    }


KWOK_USER = "berth-dev-kwok"
"""The user kwok acts as (its client certificate's common name)."""


def kwok_delete_guard() -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy, and its binding, refusing kwok's deletion of a pod that
    is not terminating. kwok finishes a terminating pod by deleting it by name, with no
    UID precondition, and may do so twice from two queued events: the second delete would
    remove a new pod of the same name (a StatefulSet's replacement) that a kubelet never
    would. Refused, kwok drops it; the new pod is finished when it terminates in turn."""
    return denying_policy(
        "berth-dev-kwok-deletes-only-terminating-pods",
        operation="DELETE",
        resource="pods",
        match_conditions={"by-kwok": f"request.userInfo.username == '{KWOK_USER}'"},
        expression="has(oldObject.metadata.deletionTimestamp)",
        message="kwok deletes only a terminating pod (a stale delete by name)",
    )


def denying_policy(
    name: str,
    *,
    operation: str,
    resource: str,
    expression: str,
    message: str,
    match_conditions: dict[str, str] | None = None,
    namespace: str | None = None,
) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy and its binding that deny an `operation` on a core
    `resource` (in `namespace` alone, if given) where `expression` is false."""
    spec: dict[str, Any] = {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": [operation],
                    "resources": [resource],
                }
            ]
        },
        "validations": [{"expression": expression, "message": message}],
    }
    if match_conditions:
        spec["matchConditions"] = [
            {"name": key, "expression": value} for key, value in match_conditions.items()
        ]
    binding: dict[str, Any] = {"policyName": name, "validationActions": ["Deny"]}
    if namespace is not None:
        selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        binding["matchResources"] = {"namespaceSelector": selector}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": spec,
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": binding,
        },
    ]


INJECT_CA_FROM = "cert-manager.io/inject-ca-from"
"""The annotation cert-manager's CA injector fills a webhook configuration's caBundle by."""


def local_certificate(certificate: dict[str, Any]) -> dict[str, Any]:
    """Berth's Certificate (manifests/cert-manager) for components reached on loopback:
    the same, plus `localhost` and 127.0.0.1, the names the API server, the scheduler
    and the health checks use here."""
    spec = certificate["spec"]
    return {
        **certificate,
        "spec": {
            **spec,
            "dnsNames": [*spec.get("dnsNames", []), "localhost"],
            "ipAddresses": [*spec.get("ipAddresses", []), "127.0.0.1"],
        },
    }


def webhook_configuration(
    *,
    urls: list[str],
    ca_bundle: str | None,
    skip_namespaces: list[str],
    scope: Scope = Scope.DEFAULT,
    inject_ca_from: str | None = None,
) -> dict[str, Any]:
    """Berth's MutatingWebhookConfiguration for webhook replicas reached by URL (the local
    cluster); the same settings as manifests/webhook (default scope) or manifests/strict,
    which go through a Service. With `inject_ca_from` (a Certificate, `namespace/name`)
    it carries no caBundle: cert-manager's CA injector writes it, as in an install."""
    metadata: dict[str, Any] = {"name": "berth"}
    if inject_ca_from is not None:
        metadata["annotations"] = {INJECT_CA_FROM: inject_ca_from}
    client_config: dict[str, str] = {} if ca_bundle is None else {"caBundle": ca_bundle}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": metadata,
        "webhooks": [
            {
                "name": f"reservation-binding-{index}.berth.sh"
                if index
                else "reservation-binding.berth.sh",
                "clientConfig": {"url": url, **client_config},
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": namespace_selector(
                    skip_namespaces=skip_namespaces, scope=scope
                ),
                "matchConditions": [created_by_a_workload_controller()],
                # Placeholders never need binding; skipping them saves a call per reservation.
                "objectSelector": {
                    "matchExpressions": [
                        {"key": "berth.sh/reservation", "operator": "DoesNotExist"}
                    ]
                },
                "admissionReviewVersions": ["v1"],
                "sideEffects": "NoneOnDryRun",
                "failurePolicy": "Ignore",
                "timeoutSeconds": 3,
                "reinvocationPolicy": "IfNeeded",
                "matchPolicy": "Equivalent",
            }
            for index, url in enumerate(urls)
        ],
    }


def eviction_namespace_selector(*, skip_namespaces: list[str], labelled: bool) -> dict[str, Any]:
    """Namespaces whose evictions reach one of the two eviction entries: never the
    skipped ones; those labelled `berth.sh/intercept-evictions: "true"`, or all others."""
    return {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": skip_namespaces},
            {
                "key": keys.INTERCEPT_EVICTIONS,
                "operator": "In" if labelled else "NotIn",
                "values": ["true"],
            },
        ]
    }


def eviction_webhook_configuration(
    *,
    urls: list[str],
    ca_bundle: str | None,
    skip_namespaces: list[str],
    inject_ca_from: str | None = None,
) -> dict[str, Any]:
    """Berth's ValidatingWebhookConfiguration on `pods/eviction` for webhook replicas
    reached by URL (`url` is the replica's base: https://host:port); the same settings as
    manifests/webhook/validating-webhook.yaml, which goes through a Service. The caBundle
    as for `webhook_configuration`."""
    metadata: dict[str, Any] = {"name": "berth-evictions"}
    if inject_ca_from is not None:
        metadata["annotations"] = {INJECT_CA_FROM: inject_ca_from}
    client_config: dict[str, str] = {} if ca_bundle is None else {"caBundle": ca_bundle}
    webhooks = []
    for index, url in enumerate(urls):
        suffix = f"-{index}" if index else ""
        for labelled, path, name in (
            (True, "/validate-eviction", "eviction-interception"),
            (False, "/validate-eviction/unlabelled", "eviction-interception-unlabelled"),
        ):
            webhooks.append(
                {
                    "name": f"{name}{suffix}.berth.sh",
                    "admissionReviewVersions": ["v1"],
                    "clientConfig": {"url": f"{url}{path}", **client_config},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods/eviction"],
                            "operations": ["CREATE"],
                            "scope": "Namespaced",
                        }
                    ],
                    "failurePolicy": "Ignore",
                    "timeoutSeconds": 3,
                    "sideEffects": "NoneOnDryRun",
                    "matchPolicy": "Equivalent",
                    "namespaceSelector": eviction_namespace_selector(
                        skip_namespaces=skip_namespaces, labelled=labelled
                    ),
                }
            )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": metadata,
        "webhooks": webhooks,
    }
