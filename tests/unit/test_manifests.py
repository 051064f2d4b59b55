"""Static checks of the deployable manifests under manifests/.

They read the YAML the way kustomize lists it and check what a production
install relies on: least-privilege RBAC, hardened pods that stay available,
the webhook's admission settings, the serving certificate and the scheduler's
extender configuration. The API server's own check of the same objects is
tests/e2e/test_manifests_dry_run.py.
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
NAMESPACE = "berth-system"
IMAGE_NAME = "ghcr.io/berth-sh/berth"
COMPONENTS = ("controller", "webhook", "extender")

Object = dict[str, Any]


def kustomization(directory: Path) -> Object:
    data: Object = yaml.safe_load((directory / "kustomization.yaml").read_text())
    return data


def objects(directory: Path) -> list[Object]:
    """The objects a kustomization lists, following its directories (patches not applied)."""
    found: list[Object] = []
    for entry in kustomization(directory).get("resources", []):
        path = (directory / entry).resolve()
        assert path.exists(), f"{directory / 'kustomization.yaml'} lists missing {entry}"
        if path.is_dir():
            found += objects(path)
        else:
            found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def one(found: list[Object], kind: str, name: str) -> Object:
    matches = [o for o in found if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def pyproject_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


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
    # No CA injector there: the overlay drops the annotation meant for it.
    [patch] = kustomization(overlay)["patches"]
    assert patch["target"] == {"kind": "MutatingWebhookConfiguration", "name": "berth"}
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
    }
    for part in ("namespace", "rbac", *COMPONENTS, "cert-manager"):
        for o in objects(MANIFESTS / part):
            expected = None if o["kind"] in cluster_scoped else NAMESPACE
            assert o["metadata"].get("namespace") == expected, (o["kind"], o["metadata"])


# --- RBAC -------------------------------------------------------------------

KOORD = "scheduling.koordinator.sh"
READ = {"get", "list", "watch"}
FULL = READ | {"create", "update", "patch", "delete"}
WORKLOADS = {
    ("apps", "replicasets"),
    ("apps", "deployments"),
    ("apps", "statefulsets"),
    ("apps", "daemonsets"),
    ("batch", "jobs"),
    ("", "replicationcontrollers"),
}

# Exactly what each component may do, per (apiGroup, resource). Granting more
# fails the test as surely as granting less.
PERMISSIONS: dict[str, dict[tuple[str, str], set[str]]] = {
    "controller": {
        (KOORD, "podmigrationjobs"): FULL,
        (KOORD, "reservations"): FULL,
        (KOORD, "podmigrationjobs/status"): {"get", "update", "patch"},
        (KOORD, "reservations/status"): {"get", "update", "patch"},
        (KOORD, "reservations/finalizers"): {"update"},
        ("", "pods"): READ | {"create", "delete", "patch"},
        ("", "pods/eviction"): {"create"},
        ("", "nodes"): READ,
        ("", "namespaces"): READ,
        ("policy", "poddisruptionbudgets"): READ,
        ("scheduling.k8s.io", "priorityclasses"): READ,
        ("", "events"): {"create", "patch"},
        ("events.k8s.io", "events"): {"create", "patch"},
        ("coordination.k8s.io", "leases"): {"get", "create", "update"},
        **dict.fromkeys(WORKLOADS, READ),
    },
    "webhook": {
        (KOORD, "reservations"): READ | {"patch", "update"},
        **{workload: {"get"} for workload in WORKLOADS},
    },
    "extender": {
        ("", "pods"): READ,
        ("", "nodes"): READ,
        (KOORD, "reservations"): READ,
    },
}


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


def test_the_controller_may_only_touch_its_own_lease_in_its_namespace() -> None:
    found = objects(MANIFESTS / "rbac")
    [role] = [r for r in roles_bound_to(found, "berth-controller") if r["kind"] == "Role"]
    assert role["metadata"]["namespace"] == NAMESPACE
    for rule in role["rules"]:
        assert rule["resources"] == ["leases"]
        # create cannot be limited by name; everything else is.
        if rule["verbs"] != ["create"]:
            assert rule["resourceNames"] == ["berth-controller"]
    # Nothing else is namespaced: all other permissions are cluster-wide reads
    # and the controller's own kinds.
    cluster_rules = [
        rule
        for r in roles_bound_to(found, "berth-controller")
        if r["kind"] == "ClusterRole"
        for rule in r["rules"]
    ]
    assert ("coordination.k8s.io", "leases") not in granted(cluster_rules)


# --- Deployments ------------------------------------------------------------

COMMANDS = {
    "controller": ["controller", "--config", "/etc/berth/config.yaml"],
    "webhook": [
        "webhook",
        "--port",
        "9443",
        "--tls-cert-file",
        "/etc/berth/tls/tls.crt",
        "--tls-private-key-file",
        "/etc/berth/tls/tls.key",
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
PORTS = {"controller": (8080, "HTTP"), "webhook": (9443, "HTTPS"), "extender": (8443, "HTTPS")}


def deployment(component: str) -> Object:
    return one(objects(MANIFESTS / component), "Deployment", f"berth-{component}")


def the_container(component: str) -> Object:
    [container] = deployment(component)["spec"]["template"]["spec"]["containers"]
    return container


def container_port(container: Object, port: int | str) -> int:
    if isinstance(port, int):
        return port
    [number] = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    assert isinstance(number, int)
    return number


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
    assert budget == {"minAvailable": 1, "selector": {"matchLabels": labels}}

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


@pytest.mark.parametrize("component", ["webhook", "extender"])
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
        m for m in the_container("controller")["volumeMounts"] if m["mountPath"] == "/etc/berth"
    ]
    [volume] = [v for v in spec["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    [generator] = kustomization(MANIFESTS / "controller")["configMapGenerator"]
    assert volume["configMap"]["name"] == generator["name"] == "berth-controller-config"
    assert generator["namespace"] == NAMESPACE
    assert generator["files"] == ["config.yaml"]


# --- controller configuration -----------------------------------------------

# The keys of MigrationControllerArgs, as the table in the seeds lists them.
SEED_KEYS = {
    "dryRun",
    "evictFailedBarePods",
    "evictLocalStoragePods",
    "evictSystemCriticalPods",
    "ignorePvcPods",
    "labelSelector",
    "priorityThreshold",
    "maxConcurrentReconciles",
    "namespaces",
    "nodeFit",
    "nodeSelector",
    "maxMigratingPerNode",
    "maxMigratingPerNamespace",
    "maxMigratingPerWorkload",
    "maxUnavailablePerWorkload",
    "skipCheckExpectedReplicas",
    "objectLimiters",
    "defaultJobMode",
    "defaultJobTTL",
    "schedulerNames",
    "evictQPS",
    "evictBurst",
    "evictionPolicy",
    "defaultDeleteOptions",
    "arbitrationArgs",
}
BERTH_KEYS = {"placeholderImage", "maxMigratingGlobally"}


def test_controller_config_writes_out_every_key_with_the_design_defaults() -> None:
    config = yaml.safe_load((MANIFESTS / "controller" / "config.yaml").read_text())
    assert set(config) == SEED_KEYS | BERTH_KEYS
    assert set(config["namespaces"]) == {"include", "exclude"}
    assert set(config["arbitrationArgs"]) == {"enabled", "interval"}
    # Where the design departs from the seeds: a vanilla scheduler.
    assert config["schedulerNames"] == ["default-scheduler"]
    assert config["defaultJobMode"] == "ReservationFirst"
    assert config["dryRun"] is False


# --- admission webhook ------------------------------------------------------


def test_webhook_configuration_never_blocks_pod_creation() -> None:
    found = objects(MANIFESTS / "webhook")
    config = one(found, "MutatingWebhookConfiguration", "berth")
    [hook] = config["webhooks"]
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "operations": ["CREATE"],
            "scope": "Namespaced",
        }
    ]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] == 3
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", NAMESPACE],
            }
        ]
    }
    service = hook["clientConfig"]["service"]
    assert service == {
        "name": "berth-webhook",
        "namespace": NAMESPACE,
        "path": "/mutate-pod",
        "port": 443,
    }
    one(found, "Service", service["name"])


# --- serving certificate ----------------------------------------------------


def test_certificate_covers_both_services_and_feeds_the_webhook_ca() -> None:
    found = objects(MANIFESTS / "cert-manager")
    certificate = one(found, "Certificate", "berth-tls")
    names = {
        f"{service}.{NAMESPACE}.svc{suffix}"
        for service in ("berth-webhook", "berth-extender")
        for suffix in ("", ".cluster.local")
    }
    assert set(certificate["spec"]["dnsNames"]) == names
    assert certificate["spec"]["secretName"] == "berth-tls"

    webhook = one(objects(MANIFESTS / "webhook"), "MutatingWebhookConfiguration", "berth")
    injected = webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert injected == f"{certificate['metadata']['namespace']}/berth-tls"


@pytest.fixture(scope="module")
def certcheck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tools/certcheck, built once: it decodes with cert-manager's own Go types."""
    if shutil.which("go") is None:
        pytest.skip("go is not on PATH: cannot build tools/certcheck")
    binary = tmp_path_factory.mktemp("certcheck") / "certcheck"
    subprocess.run(
        ["go", "build", "-o", str(binary), "."],
        cwd=ROOT / "tools" / "certcheck",
        check=True,
        timeout=600,
    )
    return binary


def test_cert_manager_objects_pass_certcheck(certcheck: Path) -> None:
    files = sorted(
        str(p)
        for p in (MANIFESTS / "cert-manager").glob("*.yaml")
        if p.name != "kustomization.yaml"
    )
    result = subprocess.run([str(certcheck), *files], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_certcheck_names_the_document_and_the_problem(certcheck: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: cert-manager.io/v1\n"
        "kind: Certificate\n"
        "metadata: {name: typo, namespace: ns}\n"
        "spec: {secretNam: x, dnsNames: [a.example], issuerRef: {name: ca}}\n"
        "---\n"
        "apiVersion: cert-manager.io/v1\n"
        "kind: Issuer\n"
        "metadata: {name: ca, namespace: ns}\n"
        "spec: {}\n"
    )
    result = subprocess.run([str(certcheck), str(bad)], capture_output=True, text=True)
    assert result.returncode == 1
    assert f"{bad}#1 Certificate ns/typo" in result.stderr
    assert 'unknown field "secretNam"' in result.stderr
    assert f"{bad}#2 Issuer ns/ca: spec sets no issuer type" in result.stderr


# --- kube-scheduler configuration -------------------------------------------

# kubescheduler.config.k8s.io/v1 Extender and ExtenderTLSConfig fields.
EXTENDER_FIELDS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
TLS_FIELDS = {
    "insecure",
    "serverName",
    "certFile",
    "keyFile",
    "caFile",
    "certData",
    "keyData",
    "caData",
}
SCHEDULER = MANIFESTS / "scheduler"


def test_scheduler_config_is_not_applied_as_an_object() -> None:
    assert not (SCHEDULER / "kustomization.yaml").exists()
    for listing in MANIFESTS.rglob("kustomization.yaml"):
        assert "scheduler" not in kustomization(listing.parent).get("resources", [])


def test_scheduler_config_calls_the_extender_service() -> None:
    config = yaml.safe_load((SCHEDULER / "kube-scheduler-config.yaml").read_text())
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    [extender] = config["extenders"]
    assert set(extender) <= EXTENDER_FIELDS
    assert set(extender["tlsConfig"]) <= TLS_FIELDS
    assert {key: value for key, value in extender.items() if key != "tlsConfig"} == {
        "urlPrefix": f"https://berth-extender.{NAMESPACE}.svc:443",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "preemptVerb": "preempt",
        "weight": 5,
        "nodeCacheCapable": True,
        "ignorable": True,
        "enableHTTPS": True,
        "httpTimeout": "3s",
    }
    # The URL names the extender's Service and port.
    url = urlsplit(extender["urlPrefix"])
    service = one(objects(MANIFESTS / "extender"), "Service", "berth-extender")
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.port == service["spec"]["ports"][0]["port"]
    assert extender["tlsConfig"].keys() == {"caData"}


# --- image ------------------------------------------------------------------


def test_requirements_lock_pins_every_runtime_dependency() -> None:
    # The image installs the lock, then the project without dependencies: a
    # dependency missing from the lock would be missing from the image.
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"not pinned: {line}"
            pins[name.lower().replace("_", "-")] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dependency in map(Requirement, project["dependencies"]):
        name = dependency.name.lower().replace("_", "-")
        assert name in pins, f"{dependency.name} is not in requirements.lock"
        assert dependency.specifier.contains(pins[name]), (dependency, pins[name])
