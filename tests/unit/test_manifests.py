"""Static checks of the deployable manifests under manifests/.

They read the YAML the way kustomize lists it and check what a production
install relies on: least-privilege RBAC, hardened pods that stay available,
the webhook's admission settings, the serving certificate and the scheduler's
extender configuration. The API server's own check of the same objects is
tests/e2e/test_manifests_dry_run.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.manifests import (
    COMPONENTS,
    IMAGE_NAME,
    MANIFESTS,
    NAMESPACE,
    PORTS,
    Object,
    container_port,
    deployment,
    kustomization,
    objects,
    one,
    pyproject_version,
    the_container,
)

# --- overlays ---------------------------------------------------------------


def test_the_full_overlay_lists_every_part() -> None:
    assert kustomization(MANIFESTS)["resources"] == [
        "namespace",
        "crds",
        "rbac",
        "controller",
        "webhook",
        "extender",
        "cert-manager",
    ]


def test_the_overlay_without_cert_manager_lists_every_other_part() -> None:
    overlay = MANIFESTS / "without-cert-manager"
    resources = kustomization(overlay)["resources"]
    assert resources == [
        f"../{part}" for part in kustomization(MANIFESTS)["resources"] if part != "cert-manager"
    ]
    # No CA injector there: the overlay drops the annotation meant for it, from both
    # webhook configurations.
    mutating, validating = kustomization(overlay)["patches"]
    assert mutating["target"] == {"kind": "MutatingWebhookConfiguration", "name": "berth"}
    assert validating["target"] == {
        "kind": "ValidatingWebhookConfiguration",
        "name": "berth-evictions",
    }
    for patch in (mutating, validating):
        assert "cert-manager.io~1inject-ca-from" in patch["patch"]


@pytest.mark.parametrize("overlay", [MANIFESTS, MANIFESTS / "without-cert-manager"])
def test_overlays_pin_the_image_to_the_project_version(overlay: Path) -> None:
    assert kustomization(overlay)["images"] == [
        {"name": IMAGE_NAME, "newTag": pyproject_version()},
    ]


def test_namespaced_objects_name_their_namespace() -> None:
    # Written out rather than set by kustomize, so each file is also valid for
    # `kubectl apply -f` and the namespace is visible where it matters (the
    # webhook's service reference, RBAC subjects, the inject-ca-from annotation).
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for part in ("namespace", "rbac", *COMPONENTS, "cert-manager"):
        for o in objects(MANIFESTS / part):
            expected = None if o["kind"] in cluster_scoped else NAMESPACE
            assert o["metadata"].get("namespace") == expected, (o["kind"], o["metadata"])


# --- RBAC -------------------------------------------------------------------

KOORD = "scheduling.koordinator.sh"
READ = {"get", "list", "watch"}

# Exactly what each component may do, per (apiGroup, resource): what its code
# does (tests/e2e/test_rbac.py checks the same against the API server's RBAC).
# Granting more fails the test as surely as granting less.
PERMISSIONS: dict[str, dict[tuple[str, str], set[str]]] = {
    "controller": {
        (KOORD, "podmigrationjobs"): READ | {"patch", "delete"},
        (KOORD, "reservations"): READ | {"create", "patch", "delete"},
        (KOORD, "podmigrationjobs/status"): {"update"},
        (KOORD, "reservations/status"): {"update"},
        (KOORD, "reservations/finalizers"): {"update"},
        ("", "pods"): READ | {"create", "delete", "patch"},
        ("", "pods/status"): {"patch"},
        ("", "pods/eviction"): {"create"},
        ("", "namespaces"): READ | {"patch"},
        ("", "nodes"): READ,
        ("", "persistentvolumes"): READ,
        ("apps", "replicasets"): READ,
        ("apps", "deployments"): READ,
        ("apps", "statefulsets"): READ,
        ("policy", "poddisruptionbudgets"): READ,
        ("scheduling.k8s.io", "priorityclasses"): READ | {"create"},
        ("", "events"): {"create", "patch"},
        ("coordination.k8s.io", "leases"): {"get", "create", "update"},
        ("", "secrets"): {"get", "create"},
    },
    "webhook": {
        (KOORD, "reservations"): READ | {"patch"},
        ("apps", "replicasets"): {"get"},
        # Eviction interception: the pod an eviction names, its job (and the requester's
        # jobs for a StatefulSet pod's name, by label), an Event on the pod; the pods
        # carrying a claim (list, by its label) before it is taken over.
        ("", "pods"): {"get", "list"},
        ("", "nodes"): {"get"},
        # The label of an eviction's namespace, read again on the labelled path.
        ("", "namespaces"): {"get"},
        (KOORD, "podmigrationjobs"): {"create", "get", "list"},
        ("", "events"): {"create", "patch"},
    },
    "extender": {
        ("", "pods"): READ,
        ("", "nodes"): READ,
        (KOORD, "reservations"): READ,
    },
}

# The roles an administrator binds to people: what each allows.
USER_ROLES: dict[str, dict[tuple[str, str], set[str]]] = {
    "berth-view": {
        (KOORD, "podmigrationjobs"): READ,
        (KOORD, "reservations"): READ,
    },
    "berth-operator": {
        (KOORD, "podmigrationjobs"): READ | {"create", "patch", "delete"},
        (KOORD, "podmigrationjobs/status"): {"patch"},
        (KOORD, "reservations"): READ,
    },
}
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def granted(rules: list[Object]) -> dict[tuple[str, str], set[str]]:
    result: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                result.setdefault((group, resource), set()).update(rule["verbs"])
    return result


def roles_bound_to(found: list[Object], account: str) -> list[Object]:
    """Every Role and ClusterRole bound to the ServiceAccount, through its bindings."""
    roles = []
    for binding in found:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subjects = [(s["kind"], s.get("namespace"), s["name"]) for s in binding["subjects"]]
        if ("ServiceAccount", NAMESPACE, account) in subjects:
            assert subjects == [("ServiceAccount", NAMESPACE, account)], binding["metadata"]
            ref = binding["roleRef"]
            roles.append(one(found, ref["kind"], ref["name"]))
    return roles


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_component_has_exactly_its_permissions(component: str) -> None:
    found = objects(MANIFESTS / "rbac")
    account = f"berth-{component}"
    assert one(found, "ServiceAccount", account)["metadata"]["namespace"] == NAMESPACE
    rules = [rule for role in roles_bound_to(found, account) for rule in role["rules"]]
    assert granted(rules) == PERMISSIONS[component]


def test_no_rule_uses_a_wildcard() -> None:
    for role in objects(MANIFESTS / "rbac"):
        for rule in role.get("rules", []):
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (role["metadata"]["name"], rule)


@pytest.mark.parametrize(
    ("resource", "name"), [("leases", "berth-controller"), ("secrets", "berth-admission-key")]
)
def test_the_controller_may_only_touch_its_own_lease_and_key_in_its_namespace(
    resource: str, name: str
) -> None:
    found = objects(MANIFESTS / "rbac")
    roles = [r for r in roles_bound_to(found, "berth-controller") if r["kind"] == "Role"]
    [role] = [r for r in roles if r["rules"][0]["resources"] == [resource]]
    assert role["metadata"]["namespace"] == NAMESPACE
    for rule in role["rules"]:
        assert rule["resources"] == [resource]
        # create cannot be limited by name; everything else is.
        if rule["verbs"] != ["create"]:
            assert rule["resourceNames"] == [name]
    # Nothing else is namespaced: all other permissions are cluster-wide reads
    # and the controller's own kinds.
    cluster_rules = [
        rule
        for r in roles_bound_to(found, "berth-controller")
        if r["kind"] == "ClusterRole"
        for rule in r["rules"]
    ]
    assert ("coordination.k8s.io", resource) not in granted(cluster_rules)
    assert ("", resource) not in granted(cluster_rules)


@pytest.mark.parametrize("name", sorted(USER_ROLES))
def test_user_roles_allow_exactly_viewing_or_running_jobs(name: str) -> None:
    found = objects(MANIFESTS / "rbac")
    role = one(found, "ClusterRole", name)
    assert granted(role["rules"]) == USER_ROLES[name]
    # Berth binds them to no one: that is the administrator's decision.
    for binding in found:
        if binding["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert binding["roleRef"]["name"] != name


def test_only_viewing_is_aggregated_into_the_built_in_roles() -> None:
    # A RoleBinding of admin or edit grants nothing on cluster-scoped jobs; a
    # ClusterRoleBinding of them would, with creating a job, allow evicting pods in
    # every namespace. So only reading is aggregated (README: Who may migrate pods).
    def aggregated(name: str) -> set[str]:
        labels = one(objects(MANIFESTS / "rbac"), "ClusterRole", name)["metadata"]["labels"]
        return {
            key.removeprefix(AGGREGATE)
            for key, on in labels.items()
            if key.startswith(AGGREGATE) and on == "true"
        }

    assert aggregated("berth-view") == {"view", "edit", "admin"}
    assert aggregated("berth-operator") == set()
    for role in ("controller", "webhook", "extender"):
        assert aggregated(f"berth-{role}") == set()


# --- Deployments ------------------------------------------------------------

COMMANDS = {
    "controller": [
        "controller",
        "--config",
        "/etc/berth/config/config.yaml",
        "--tls-cert-file",
        "/etc/berth/tls/tls.crt",
        "--tls-private-key-file",
        "/etc/berth/tls/tls.key",
    ],
    "webhook": [
        "webhook",
        "--port",
        "9443",
        "--tls-cert-file",
        "/etc/berth/tls/tls.crt",
        "--tls-private-key-file",
        "/etc/berth/tls/tls.key",
        "--request-deadline",
        "2",
        "--config",
        "/etc/berth/config/config.yaml",
    ],
    "extender": [
        "extender",
        "--port",
        "8443",
        "--tls-cert-file",
        "/etc/berth/tls/tls.crt",
        "--tls-private-key-file",
        "/etc/berth/tls/tls.key",
    ],
}


@pytest.mark.parametrize("component", COMPONENTS)
def test_deployment_runs_the_component_from_the_one_image(component: str) -> None:
    pod = deployment(component)["spec"]["template"]["spec"]
    container = the_container(component)
    assert container["image"] == f"{IMAGE_NAME}:{pyproject_version()}"
    assert "command" not in container  # the image's entrypoint is `berth`
    assert container["args"] == COMMANDS[component]
    assert pod["serviceAccountName"] == f"berth-{component}"


@pytest.mark.parametrize("component", COMPONENTS)
def test_deployment_is_probed_on_the_component_port(component: str) -> None:
    container = the_container(component)
    port, scheme = PORTS[component]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert get.get("scheme", "HTTP") == scheme
        assert container_port(container, get["port"]) == port


@pytest.mark.parametrize("component", COMPONENTS)
def test_deployment_requests_and_limits_cpu_and_memory(component: str) -> None:
    resources = the_container(component)["resources"]
    for bound in ("requests", "limits"):
        assert set(resources[bound]) == {"cpu", "memory"}, bound


@pytest.mark.parametrize("component", COMPONENTS)
def test_deployment_is_hardened(component: str) -> None:
    pod = deployment(component)["spec"]["template"]["spec"]
    container = the_container(component)

    def effective(key: str) -> Any:
        # A container's setting wins over the pod's.
        return container.get("securityContext", {}).get(
            key, pod.get("securityContext", {}).get(key)
        )

    assert effective("runAsNonRoot") is True
    assert effective("seccompProfile") == {"type": "RuntimeDefault"}
    own = container["securityContext"]
    assert own["allowPrivilegeEscalation"] is False
    assert own["readOnlyRootFilesystem"] is True
    assert own["capabilities"] == {"drop": ["ALL"]}
    # With a read-only root, /tmp is the only scratch space: an emptyDir.
    [tmp] = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    [volume] = [v for v in pod["volumes"] if v["name"] == tmp["name"]]
    assert "emptyDir" in volume


@pytest.mark.parametrize("component", ["webhook", "extender"])
def test_servers_stay_available_through_drains(component: str) -> None:
    found = objects(MANIFESTS / component)
    spec = deployment(component)["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["replicas"] == 2
    assert spec["selector"] == {"matchLabels": labels}

    budget = one(found, "PodDisruptionBudget", f"berth-{component}")["spec"]
    assert budget == {
        "maxUnavailable": 1,
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": {"matchLabels": labels},
    }

    [term] = spec["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"] == {"matchLabels": labels}


@pytest.mark.parametrize("component", ["webhook", "extender"])
def test_service_serves_https_on_443(component: str) -> None:
    service = one(objects(MANIFESTS / component), "Service", f"berth-{component}")["spec"]
    container = the_container(component)
    [port] = service["ports"]
    assert port["port"] == 443
    assert container_port(container, port["targetPort"]) == PORTS[component][0]
    assert service["selector"] == deployment(component)["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("component", COMPONENTS)
def test_servers_mount_the_serving_certificate(component: str) -> None:
    pod = deployment(component)["spec"]["template"]["spec"]
    [mount] = [
        m for m in the_container(component)["volumeMounts"] if m["mountPath"] == "/etc/berth/tls"
    ]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "berth-tls"


def test_controller_is_a_single_leader_elected_replica_with_its_config() -> None:
    spec = deployment("controller")["spec"]
    assert spec["replicas"] == 1
    [mount] = [
        m
        for m in the_container("controller")["volumeMounts"]
        if m["mountPath"] == "/etc/berth/config"
    ]
    [volume] = [v for v in spec["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    [generator] = kustomization(MANIFESTS / "controller")["configMapGenerator"]
    assert volume["configMap"]["name"] == generator["name"] == "berth-controller-config"
    assert generator["namespace"] == NAMESPACE
    assert generator["files"] == ["config.yaml"]
