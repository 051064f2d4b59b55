"""The files the local control plane is started with."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from berth.api import keys
from berth.protocol import CONTROLLER_IDENTITIES, CONTROLLER_MANAGER, created_by_controller
from berth.settings import DEFAULT_SCHEDULER_NAMES
from devtools import binaries, render
from devtools.render import Scope

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def test_kubeconfig_embeds_certificates_and_selects_its_context() -> None:
    config = render.kubeconfig(
        server="https://127.0.0.1:6443", ca_pem=b"CA", cert_pem=b"CERT", key_pem=b"KEY"
    )
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    assert cluster["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"CA"
    assert base64.b64decode(user["client-certificate-data"]) == b"CERT"
    assert config["current-context"] == config["contexts"][0]["name"]


def test_token_kubeconfig_authenticates_with_the_token_alone() -> None:
    config = render.token_kubeconfig(
        server="https://127.0.0.1:6443", ca_pem=b"CA", token="T", user_name="system:sa"
    )
    [user] = config["users"]
    assert user == {"name": "system:sa", "user": {"token": "T"}}
    [context] = config["contexts"]
    assert context["context"]["user"] == "system:sa"
    assert config["current-context"] == context["name"]


def test_scheduler_config_lists_extenders_only_when_given() -> None:
    plain = render.scheduler_config(kubeconfig_path=Path("/k"))
    assert "extenders" not in plain
    assert plain["profiles"] == [
        {"schedulerName": "default-scheduler"},
        {"schedulerName": "koord-scheduler"},
    ]
    extender = {"urlPrefix": "http://127.0.0.1:1", "filterVerb": "filter"}
    with_extender = render.scheduler_config(
        kubeconfig_path=Path("/k"), scheduler_names=["x"], extenders=[extender]
    )
    assert with_extender["extenders"] == [extender]
    assert with_extender["profiles"] == [{"schedulerName": "x"}]
    assert with_extender["leaderElection"] == {"leaderElect": False}


def test_scheduler_config_sets_the_client_rate_limits() -> None:
    config = render.scheduler_config(kubeconfig_path=Path("/k"), qps=200, burst=400)
    assert config["clientConnection"] == {"kubeconfig": "/k", "qps": 200, "burst": 400}
    assert "percentageOfNodesToScore" not in config


def test_fake_node_is_managed_by_kwok_with_the_requested_size() -> None:
    node = render.fake_node(name="node-7", cpu="4", memory="8Gi", pods=20)
    assert node["metadata"]["annotations"][render.KWOK_NODE_ANNOTATION] == "fake"
    labels = node["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == "node-7"
    # The beta labels a kubelet sets, so that no controller has to add them.
    assert labels["beta.kubernetes.io/os"] == labels["kubernetes.io/os"]
    assert labels["beta.kubernetes.io/arch"] == labels["kubernetes.io/arch"]
    assert node["status"]["allocatable"] == {"cpu": "4", "memory": "8Gi", "pods": "20"}


def test_kwok_configuration_sets_parallelism_and_keeps_kwok_defaults() -> None:
    config = render.kwok_configuration(parallelism=16)
    assert config["kind"] == "KwokConfiguration"
    options = config["options"]
    for key in ("nodeLeaseParallelism", "nodePlayStageParallelism", "podPlayStageParallelism"):
        assert options[key] == 16
    # kwok defaults nothing once given a configuration: its defaults are spelled out.
    assert options["podsOnNodeSyncParallelism"] == 1
    assert options["enablePodsOnNodeSyncListPager"] is True


def test_kwoks_deletes_are_checked_only_for_kwok_and_only_on_pods() -> None:
    policy, binding = render.kwok_delete_guard()
    spec = policy["spec"]
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert (rule["operations"], rule["resources"]) == (["DELETE"], ["pods"])
    [only_kwok] = spec["matchConditions"]
    assert only_kwok["expression"] == f"request.userInfo.username == '{render.KWOK_USER}'"
    assert spec["validations"][0]["expression"] == "has(oldObject.metadata.deletionTimestamp)"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }


def test_a_denying_policy_bound_to_one_namespace_selects_it_by_its_name_label() -> None:
    _, binding = render.denying_policy(
        "p", operation="CREATE", resource="pods/eviction", expression="false", message="m",
        namespace="team-a",
    )  # fmt: skip
    selector = binding["spec"]["matchResources"]["namespaceSelector"]
    assert selector == {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}


def test_kubernetes_version_comes_from_the_kcp_module() -> None:
    assert binaries.kubernetes_version().startswith("v1.")


def test_source_hash_depends_on_the_go_version() -> None:
    assert binaries.source_hash("go1.26.0") != binaries.source_hash("go1.26.1")
    assert binaries.source_hash("go1.26.0") == binaries.source_hash("go1.26.0")


def test_webhook_configuration_has_one_entry_per_replica_and_never_blocks() -> None:
    config = render.webhook_configuration(
        urls=["https://127.0.0.1:1/m", "https://127.0.0.1:2/m"],
        ca_bundle="Q0E=",
        skip_namespaces=["kube-system"],
    )
    hooks = config["webhooks"]
    assert [h["clientConfig"]["url"] for h in hooks] == [
        "https://127.0.0.1:1/m",
        "https://127.0.0.1:2/m",
    ]
    assert len({h["name"] for h in hooks}) == 2
    for hook in hooks:
        assert hook["failurePolicy"] == "Ignore"
        assert hook["sideEffects"] == "NoneOnDryRun"
        assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system"]


def test_with_cert_manager_the_caBundle_is_left_to_the_injector() -> None:
    config = render.webhook_configuration(
        urls=["https://127.0.0.1:1/m"],
        ca_bundle=None,
        skip_namespaces=["kube-system"],
        inject_ca_from="berth-system/berth-tls",
    )
    assert config["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "berth-system/berth-tls"
    }
    assert config["webhooks"][0]["clientConfig"] == {"url": "https://127.0.0.1:1/m"}


def test_the_local_certificate_adds_the_loopback_names_to_the_manifest() -> None:
    [certificate] = [
        doc
        for doc in yaml.safe_load_all((MANIFESTS / "cert-manager" / "certificate.yaml").read_text())
        if doc
    ]
    local = render.local_certificate(certificate)
    assert local["spec"]["dnsNames"] == [*certificate["spec"]["dnsNames"], "localhost"]
    assert local["spec"]["ipAddresses"] == ["127.0.0.1"]
    assert {**local["spec"], "dnsNames": None, "ipAddresses": None} == {
        **certificate["spec"],
        "dnsNames": None,
        "ipAddresses": None,
    }
    assert local["metadata"] == certificate["metadata"]


def test_default_scope_calls_the_extender_for_berths_pods_only() -> None:
    [entry] = render.berth_extenders(
        url="https://127.0.0.1:1", ca_bundle="Q0E=", scope=Scope.DEFAULT
    )
    assert (entry["filterVerb"], entry["prioritizeVerb"], entry["preemptVerb"]) == (
        "filter",
        "prioritize",
        "preempt",
    )
    assert entry["managedResources"] == [
        {"name": keys.RESERVATION_RESOURCE, "ignoredByScheduler": True}
    ]
    assert entry["tlsConfig"] == {"caData": "Q0E="}
    assert entry["enableHTTPS"] is True
    assert render.ignored_resources(Scope.DEFAULT) == []


def test_strict_scope_calls_the_extender_for_every_pod_and_ignores_the_marker() -> None:
    entries = render.berth_extenders(url="http://127.0.0.1:1", ca_bundle=None, scope=Scope.STRICT)
    [filtering] = [e for e in entries if "filterVerb" in e]
    assert "managedResources" not in filtering
    assert filtering["preemptVerb"] == "preempt"
    assert "prioritizeVerb" not in filtering
    # Prioritize only for Berth's own pods: an ordinary pod costs one round trip.
    [ranking] = [e for e in entries if "prioritizeVerb" in e]
    assert ranking["managedResources"] == [
        {"name": keys.RESERVATION_RESOURCE, "ignoredByScheduler": True}
    ]
    assert "filterVerb" not in ranking
    assert "preemptVerb" not in ranking
    assert {e["urlPrefix"] for e in entries} == {"http://127.0.0.1:1"}
    assert all("enableHTTPS" not in e for e in entries)
    config = render.scheduler_config(
        kubeconfig_path=Path("/k"),
        extenders=entries,
        ignored_resources=render.ignored_resources(Scope.STRICT),
    )
    assert config["profiles"] == [
        {
            "schedulerName": name,
            "pluginConfig": [
                {
                    "name": "NodeResourcesFit",
                    "args": {"ignoredResources": [keys.RESERVATION_RESOURCE]},
                }
            ],
        }
        for name in DEFAULT_SCHEDULER_NAMES
    ]


def test_webhook_namespace_selector_requires_the_migrating_label_in_the_default_scope() -> None:
    skip = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
    migrating = {"key": keys.MIGRATING_LABEL, "operator": "In", "values": ["true"]}
    default = render.webhook_configuration(
        urls=["https://127.0.0.1:1/m"], ca_bundle="Q0E=", skip_namespaces=["kube-system"]
    )
    strict = render.webhook_configuration(
        urls=["https://127.0.0.1:1/m"],
        ca_bundle="Q0E=",
        skip_namespaces=["kube-system"],
        scope=Scope.STRICT,
    )
    assert default["webhooks"][0]["namespaceSelector"] == {"matchExpressions": [skip, migrating]}
    assert strict["webhooks"][0]["namespaceSelector"] == {"matchExpressions": [skip]}


def test_the_webhook_is_called_only_for_pods_a_workload_controller_creates() -> None:
    """In both scopes; the users it names are exactly those the webhook's own decision
    takes for a controller of a kind it binds."""
    for scope in Scope:
        config = render.webhook_configuration(
            urls=["https://127.0.0.1:1/m"], ca_bundle="Q0E=", skip_namespaces=[], scope=scope
        )
        assert config["webhooks"][0]["matchConditions"] == [
            render.created_by_a_workload_controller()
        ]
    expression = render.created_by_a_workload_controller()["expression"]
    prefix = "request.userInfo.username in ["
    assert expression.startswith(prefix)
    assert expression.endswith("]")
    named = [user.strip().strip("'") for user in expression[len(prefix) : -1].split(",")]
    recognised = {
        user
        for kind in CONTROLLER_IDENTITIES
        for user in [*CONTROLLER_IDENTITIES.values(), CONTROLLER_MANAGER, "system:admin"]
        if created_by_controller({"apiVersion": kind[0], "kind": kind[1]}, user)
    }
    assert sorted(named) == sorted(recognised)
    assert len(named) == len(set(named))
