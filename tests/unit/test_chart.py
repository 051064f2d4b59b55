"""The Helm chart (charts/berth) renders what manifests/ does, and says so when it does not.

manifests/ is the source of truth. These tests render both with the real tools (Helm
built from tools/helm, kustomize inside our kubectl) and compare the objects; a failure
lists every differing object and field, so a change to manifests/ shows exactly what the
chart must follow. What the API server makes of the chart is tests/e2e/test_chart.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from berth.crds import render_crds
from berth.settings import MigrationControllerArgs, load_args
from devtools.binaries import REPO as ROOT
from devtools.binaries import ensure_binaries
from devtools.chart import (
    CHART,
    MANIFESTS,
    README,
    Object,
    RenderError,
    ValueDoc,
    differences,
    helm_template,
    kustomize,
    readme_with_table,
    undocumented,
    value_docs,
    values_table,
)
from devtools.helm import helm_binary
from devtools.render import created_by_a_workload_controller

HINT = (
    "\nmanifests/ is the source of truth: change charts/berth/templates (or values.yaml) to "
    "render the same objects, or run `make crds` for the CRDs."
)


@pytest.fixture(scope="module")
def helm() -> Path:
    if shutil.which("go") is None:
        pytest.skip("go is not on PATH: cannot build Helm from tools/helm")
    return helm_binary()


@pytest.fixture(scope="module")
def kubectl() -> Path:
    if shutil.which("go") is None:
        pytest.skip("go is not on PATH: cannot build kubectl")
    return ensure_binaries().kubectl


def installed(objects: list[Object]) -> list[Object]:
    """What an install of manifests/ holds besides its Namespace: the chart installs into
    the release namespace and leaves creating it (with its Pod Security label) to the
    installer, as Helm charts do."""
    return [obj for obj in objects if obj["kind"] != "Namespace"]


def not_hooks(objects: list[Object]) -> list[Object]:
    """The chart's objects but its Helm hooks (the uninstall hook), which have no
    counterpart in manifests/: a kustomize install runs their command by hand (README)."""
    return [
        obj for obj in objects if "helm.sh/hook" not in (obj["metadata"].get("annotations") or {})
    ]


def assert_same(manifests: list[Object], chart: list[Object], what: str) -> None:
    found = differences(installed(manifests), not_hooks(chart))
    assert not found, f"{what}: {len(found)} differences\n" + "\n".join(found) + HINT


def one(objects: list[Object], kind: str, name: str) -> Object:
    [match] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return match


# --- the chart equals manifests/ --------------------------------------------------


def test_default_values_render_the_objects_of_manifests(helm: Path, kubectl: Path) -> None:
    assert_same(kustomize(kubectl, MANIFESTS), helm_template(helm), "default values")


def test_without_cert_manager_renders_the_objects_of_that_overlay(
    helm: Path, kubectl: Path
) -> None:
    assert_same(
        kustomize(kubectl, MANIFESTS / "without-cert-manager"),
        helm_template(helm, values=["certManager.enabled=false"]),
        "certManager.enabled=false",
    )


def with_component(tmp_path: Path, component: str) -> Path:
    """A kustomization of manifests/ with one of its Components added."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(MANIFESTS, tmp_path)],
                "components": [os.path.relpath(MANIFESTS / component, tmp_path)],
            }
        )
    )
    return tmp_path


def test_strict_scope_renders_manifests_with_the_strict_component(
    helm: Path, kubectl: Path, tmp_path: Path
) -> None:
    assert_same(
        kustomize(kubectl, with_component(tmp_path, "strict")),
        helm_template(helm, values=["scope=strict"]),
        "scope=strict",
    )


def test_the_pod_policy_renders_manifests_with_the_pod_policy_component(
    helm: Path, kubectl: Path, tmp_path: Path
) -> None:
    values = ["controller.podPolicy.enabled=true"]
    assert_same(
        kustomize(kubectl, with_component(tmp_path, "pod-policy")),
        helm_template(helm, values=values),
        values[0],
    )
    names = {o["metadata"]["name"] for o in helm_template(helm, values=values)}
    assert {"berth-controller-pods", "berth-controller-namespaces"} <= names
    assert "berth-controller-pods" not in {o["metadata"]["name"] for o in helm_template(helm)}


def test_the_pod_policy_allows_the_configured_placeholder_image_only(helm: Path) -> None:
    values = ["controller.podPolicy.enabled=true", "controller.config.placeholderImage=my/pause:1"]
    [policy] = [
        o
        for o in helm_template(helm, values=values)
        if o["kind"] == "ValidatingAdmissionPolicy"
        and o["metadata"]["name"] == "berth-controller-pods"
    ]
    create = policy["spec"]["validations"][0]["expression"]
    assert 'object.spec.containers[0].image == "my/pause:1"' in create
    assert 'startsWith("my/pause:1" + "@")' in create
    assert "registry.k8s.io/pause" not in create


def test_the_chart_crds_are_the_generated_ones() -> None:
    rendered = {name: text for name, text in render_crds().items() if name != "kustomization.yaml"}
    committed = {path.name: path.read_text() for path in (CHART / "crds").iterdir()}
    assert committed == rendered, "run `make crds` and commit charts/berth/crds"


# --- the comparison itself -----------------------------------------------------------


def deployment(replicas: int, **labels: str) -> Object:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "berth-webhook",
            "namespace": "berth-system",
            "labels": {"app.kubernetes.io/name": "berth", **labels},
        },
        "spec": {
            "replicas": replicas,
            "template": {"spec": {"volumes": [{"name": "c", "configMap": {"name": "x"}}]}},
        },
    }


def config_map(name: str, text: str) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "berth-system"},
        "data": {"config.yaml": text},
    }


def test_a_difference_names_the_object_and_the_field() -> None:
    role = {"apiVersion": "v1", "kind": "ClusterRole", "metadata": {"name": "berth-view"}}
    found = differences([deployment(2), role], [deployment(3)])
    assert found == [
        "only in manifests/: ClusterRole/-/berth-view",
        "Deployment/berth-system/berth-webhook: spec.replicas: manifests 2 != chart 3",
    ]
    assert differences([], [role]) == ["only in the chart: ClusterRole/-/berth-view"]


def test_helm_labels_the_config_hash_and_config_layout_are_not_differences() -> None:
    helm_labels = {
        "app.kubernetes.io/instance": "berth",
        "app.kubernetes.io/managed-by": "Helm",
        "helm.sh/chart": "berth-0.1.0",
    }
    assert differences([deployment(2)], [deployment(2, **helm_labels)]) == []
    assert (
        differences(
            [config_map("berth-controller-config-abcde12345", "# a comment\ndryRun: false\n")],
            [config_map("berth-controller-config-0123456789", "dryRun: false")],
        )
        == []
    )
    assert differences(
        [config_map("berth-controller-config-abcde12345", "dryRun: false")],
        [config_map("berth-controller-config-abcde12345", "dryRun: true")],
    ) == [
        "ConfigMap/berth-system/berth-controller-config: data.config.yaml.dryRun: "
        "manifests false != chart true"
    ]


def test_a_list_of_another_length_is_shown_whole() -> None:
    want, got = deployment(1), deployment(1)
    got["spec"]["template"]["spec"]["volumes"].append({"name": "d", "emptyDir": {}})
    [line] = differences([want], [got])
    assert line.startswith("Deployment/berth-system/berth-webhook: spec.template.spec.volumes: ")
    assert '"name": "d"' in line


# --- values ------------------------------------------------------------------------


def rendered_config(helm: Path, *values: str) -> str:
    objects = helm_template(helm, values=list(values))
    [config] = [o for o in objects if o["kind"] == "ConfigMap"]
    text: str = config["data"]["config.yaml"]
    return text


def test_the_controller_loads_the_rendered_config(helm: Path, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(rendered_config(helm, "controller.config.maxMigratingPerNode=5"))
    assert load_args(path).max_migrating_per_node == 5


def test_a_config_change_renames_the_config_map_and_so_rolls_out(helm: Path) -> None:
    def names(*values: str) -> tuple[str, str]:
        objects = helm_template(helm, values=list(values))
        [config] = [o for o in objects if o["kind"] == "ConfigMap"]
        volumes = one(objects, "Deployment", "berth-controller")["spec"]["template"]["spec"][
            "volumes"
        ]
        [mounted] = [v["configMap"]["name"] for v in volumes if "configMap" in v]
        return config["metadata"]["name"], mounted

    default, changed = names(), names("controller.config.dryRun=true")
    assert default[0] == default[1]
    assert changed[0] == changed[1]
    assert default[0] != changed[0]


def test_the_schema_knows_every_config_key_and_no_other() -> None:
    """values.schema.json refuses an unknown controller.config key at install, rather
    than the controller at start; it must accept every key the controller reads."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    config = schema["properties"]["controller"]["allOf"][1]["properties"]["config"]
    known = MigrationControllerArgs.model_json_schema(by_alias=True)["properties"]
    assert config["additionalProperties"] is False
    assert set(config["properties"]) == set(known), "update values.schema.json"


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("scope=wide", "scope"),
        ("controller.replicas=-1", "replicas"),
        ("webhook.replica=3", "replica"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("controller.config.maxMigratingPerNod=5", "maxMigratingPerNod"),
        ("tls.caBundle=-----BEGIN CERTIFICATE-----", "caBundle"),
        ("controller.config.evictionInterception.allNamespaces=yes", "allNamespaces"),
        ("controller.config.evictionInterception.requesters.user=x", "user"),
        ("webhook.evictionInterception.enabled=1", "enabled"),
        ("extender.config.dryRun=true", "config"),
        ("webhook.config.dryRun=true", "config"),
        ("extender.evictionInterception.enabled=true", "evictionInterception"),
        ("controller.clientCA.secretName=x", "clientCA"),
        ("networkPolicy.from.scheduler[0].podSelector.x=y", "scheduler"),
        ("nodeSelector.pool=null", "pool"),
    ],
)
def test_bad_values_are_refused_naming_the_key(helm: Path, value: str, named: str) -> None:
    with pytest.raises(RenderError, match=named):
        helm_template(helm, values=[value])


def test_non_default_values_reach_their_objects(helm: Path) -> None:
    objects = helm_template(
        helm,
        release="platform",
        namespace="ops",
        values=[
            "image.tag=0.2.0",
            "image.pullPolicy=Always",
            "controller.replicas=2",
            "controller.podDisruptionBudget.enabled=true",
            "webhook.resources.limits.memory=512Mi",
            "certManager.enabled=false",
            "tls.secretName=own-tls",
            "tls.caBundle=Q0E=",
            "networkPolicy.enabled=false",
            "serviceMonitor.enabled=true",
            "serviceMonitor.labels.release=prometheus",
            "imagePullSecrets[0].name=registry",
            "securityContext.readOnlyRootFilesystem=false",
            "podSecurityContext.runAsUser=1000",
        ],
    )
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert all(
        name.startswith("platform-berth")
        for kind, name in names
        if kind != "CustomResourceDefinition"
    )
    kinds = {kind for kind, _ in names}
    assert "NetworkPolicy" not in kinds
    assert "Certificate" not in kinds
    assert {
        ("PodDisruptionBudget", "platform-berth-controller"),
        ("ServiceMonitor", "platform-berth"),
    } <= names

    controller = one(objects, "Deployment", "platform-berth-controller")
    pod = controller["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert controller["spec"]["replicas"] == 2
    assert container["image"] == "ghcr.io/berth-sh/berth:0.2.0"
    assert container["imagePullPolicy"] == "Always"
    # The Lease and the admission key follow the controller into the release namespace.
    assert container["args"][-2:] == ["--lease-namespace", "ops"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["securityContext"]["runAsUser"] == 1000
    assert container["securityContext"]["readOnlyRootFilesystem"] is False
    assert {"name": "tls", "secret": {"secretName": "own-tls"}} in pod["volumes"]
    webhook = one(objects, "Deployment", "platform-berth-webhook")
    assert (
        webhook["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
        == "512Mi"
    )

    hook = one(objects, "MutatingWebhookConfiguration", "platform-berth")
    assert "annotations" not in hook["metadata"]
    [entry] = hook["webhooks"]
    assert entry["clientConfig"] == {
        "service": {
            "name": "platform-berth-webhook",
            "namespace": "ops",
            "path": "/mutate-pod",
            "port": 443,
        },
        "caBundle": "Q0E=",
    }
    assert entry["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "ops"]
    # kube-controller-manager's identities, whatever the release is called.
    assert entry["matchConditions"] == [created_by_a_workload_controller()]
    evictions = one(objects, "ValidatingWebhookConfiguration", "platform-berth-evictions")
    assert "annotations" not in evictions["metadata"]
    for entry in evictions["webhooks"]:
        assert entry["clientConfig"]["service"]["name"] == "platform-berth-webhook"
        assert entry["clientConfig"]["service"]["namespace"] == "ops"
        assert entry["clientConfig"]["caBundle"] == "Q0E="
        assert entry["namespaceSelector"]["matchExpressions"][0]["values"] == [
            "kube-system",
            "ops",
        ]
    # The controller's own evictions pass: the webhook knows its ServiceAccount.
    args = webhook["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--controller-user", "system:serviceaccount:ops:platform-berth-controller"]
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for binding in (o for o in objects if o["kind"] == kind):
            assert {s["namespace"] for s in binding["subjects"]} == {"ops"}
    monitor = one(objects, "ServiceMonitor", "platform-berth")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["tlsConfig"]["ca"]["secret"]["name"] == "own-tls"


def test_with_cert_manager_the_certificate_names_the_release_services(helm: Path) -> None:
    objects = helm_template(helm, release="platform", namespace="ops")
    certificate = one(objects, "Certificate", "platform-berth-tls")
    assert certificate["spec"]["secretName"] == "platform-berth-tls"
    assert certificate["spec"]["dnsNames"] == [
        "platform-berth-webhook.ops.svc",
        "platform-berth-webhook.ops.svc.cluster.local",
        "platform-berth-extender.ops.svc",
        "platform-berth-extender.ops.svc.cluster.local",
    ]
    for kind, name in [
        ("MutatingWebhookConfiguration", "platform-berth"),
        ("ValidatingWebhookConfiguration", "platform-berth-evictions"),
    ]:
        assert one(objects, kind, name)["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": "ops/platform-berth-tls"
        }


def test_eviction_interception_can_be_left_out(helm: Path) -> None:
    objects = helm_template(helm, values=["webhook.evictionInterception.enabled=false"])
    assert "ValidatingWebhookConfiguration" not in {o["kind"] for o in objects}
    role = one(objects, "ClusterRole", "berth-webhook")
    rights = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    # Binding replacements still lists a namespace's pods by a claim's label before it
    # takes that claim over (`webhook.app.carried`).
    assert {resource for resource, _ in rights} == {"reservations", "replicasets", "pods"}
    assert {verb for resource, verb in rights if resource == "pods"} == {"list"}


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_a_components_disruption_budget_never_blocks_a_drain(helm: Path, replicas: int) -> None:
    objects = helm_template(
        helm,
        values=[
            f"webhook.replicas={replicas}",
            f"extender.replicas={replicas}",
            f"controller.replicas={replicas}",
            "controller.podDisruptionBudget.enabled=true",
        ],
    )
    budgets = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert len(budgets) == 3
    for budget in budgets:
        assert budget["spec"]["maxUnavailable"] == 1
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        assert "minAvailable" not in budget["spec"]


def test_an_image_digest_pins_the_image(helm: Path) -> None:
    digest = "sha256:" + "ab" * 32
    objects = helm_template(helm, values=[f"image.digest={digest}", "image.tag=0.9.0"])
    images = {
        container["image"]
        for o in objects
        if o["kind"] == "Deployment"
        for container in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"ghcr.io/berth-sh/berth@{digest}"}
    with pytest.raises(RenderError, match="digest"):
        helm_template(helm, values=["image.digest=0.9.0"])


def test_the_chart_takes_the_global_values_of_a_parent_chart(helm: Path) -> None:
    objects = helm_template(helm, values=["global.imageRegistry=registry.example"])
    assert any(o["kind"] == "Deployment" for o in objects)


def test_the_controller_loads_the_rendered_eviction_interception(
    helm: Path, tmp_path: Path
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        rendered_config(
            helm,
            "controller.config.evictionInterception.allNamespaces=true",
            "controller.config.evictionInterception.requesters.groups[0]=system:nodes",
        )
    )
    interception = load_args(path).eviction_interception
    assert interception.all_namespaces is True
    assert interception.requesters is not None
    assert interception.requesters.groups == ["system:nodes"]
    assert interception.requesters.users == []


# --- the values table --------------------------------------------------------------


def test_every_value_is_described() -> None:
    assert undocumented(value_docs((CHART / "values.yaml").read_text())) == []


def test_the_readme_table_is_written_from_values_yaml() -> None:
    table = values_table(value_docs((CHART / "values.yaml").read_text()))
    readme = README.read_text()
    assert readme_with_table(readme, table) == readme, "run `make chart-docs`"


VALUES = """\
# Top.
a: 1
b:
  # Inner.
  c: [x]
  d: null

# Described as a whole.
e:
  f: 2
g:
  h: 3
# A list of mappings.
i:
  - name: j
    k: 4
l: 5
"""


def test_value_docs_take_the_comment_above_each_key() -> None:
    assert value_docs(VALUES) == [
        ValueDoc("a", 1, "Top."),
        ValueDoc("b", {"c": ["x"], "d": None}, ""),
        ValueDoc("b.c", ["x"], "Inner."),
        ValueDoc("b.d", None, ""),
        ValueDoc("e", {"f": 2}, "Described as a whole."),
        ValueDoc("e.f", 2, ""),
        ValueDoc("g", {"h": 3}, ""),
        ValueDoc("g.h", 3, ""),
        ValueDoc("i", [{"name": "j", "k": 4}], "A list of mappings."),
        ValueDoc("l", 5, ""),
    ]


def test_a_value_without_description_is_reported() -> None:
    assert undocumented(value_docs(VALUES)) == ["b.d", "g.h", "l"]


def test_the_table_lists_the_described_keys() -> None:
    assert values_table(value_docs(VALUES)).splitlines() == [
        "| Key | Default | Description |",
        "| --- | --- | --- |",
        "| `a` | `1` | Top. |",
        '| `b.c` | `["x"]` | Inner. |',
        '| `e` | `{"f": 2}` | Described as a whole. |',
        '| `i` | `[{"name": "j", "k": 4}]` | A list of mappings. |',
    ]


# --- helm lint (offline) -----------------------------------------------------------


@pytest.mark.parametrize(
    "values", [[], ["scope=strict"], ["certManager.enabled=false", "serviceMonitor.enabled=true"]]
)
def test_helm_lint_passes(helm: Path, values: list[str]) -> None:
    command = [str(helm), "lint", "--strict", str(CHART)]
    command += [arg for value in values for arg in ("--set", value)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_chart_is_versioned_with_the_project() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["apiVersion"] == "v2"
    assert chart["version"] == chart["appVersion"] == version


def notes(helm: Path, tmp_path: Path, *values: str) -> str:
    """The install notes, rendered by a client-side dry run (no cluster)."""
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "none")}
    env |= {f"HELM_{kind}_HOME": str(tmp_path / kind) for kind in ("CACHE", "CONFIG", "DATA")}
    command = [str(helm), "install", "berth", str(CHART), "--dry-run=client"]
    result = subprocess.run(
        command + [arg for value in values for arg in ("--set", value)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.partition("\nNOTES:\n")[2]


@pytest.mark.parametrize("component", ["webhook", "extender"])
def test_a_server_answers_only_its_callers_client_certificate_when_given_its_ca(
    helm: Path, component: str
) -> None:
    """The webhook's caller is the API server, the extender's kube-scheduler."""
    objects = helm_template(helm, values=[f"{component}.clientCA.secretName=callers-ca"])
    pod = one(objects, "Deployment", f"berth-{component}")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    flag = container["args"].index("--client-ca-file")
    assert container["args"][flag + 1] == "/etc/berth/client-ca/ca.crt"
    assert {"name": "client-ca", "mountPath": "/etc/berth/client-ca", "readOnly": True} in (
        container["volumeMounts"]
    )
    assert {
        "name": "client-ca",
        "secret": {"secretName": "callers-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
    } in pod["volumes"]
    plain = one(helm_template(helm), "Deployment", f"berth-{component}")
    assert "--client-ca-file" not in plain["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_notes_ask_for_the_schedulers_client_certificate_when_the_extender_wants_one(
    helm: Path, tmp_path: Path
) -> None:
    printed = notes(helm, tmp_path, "extender.clientCA.secretName=callers-ca")
    extenders = yaml.safe_load(printed.split("\n---\n", 2)[1])["extenders"]
    assert {"caData", "certData", "keyData"} == set(extenders[0]["tlsConfig"])
    assert "Secret\ncallers-ca" in printed or "Secret callers-ca" in printed
    plain = yaml.safe_load(notes(helm, tmp_path).split("\n---\n", 2)[1])["extenders"]
    assert set(plain[0]["tlsConfig"]) == {"caData"}


def test_the_notes_warn_when_the_webhook_answers_anyone(helm: Path, tmp_path: Path) -> None:
    warning = "No webhook.clientCA was given"
    assert warning in notes(helm, tmp_path)
    assert warning not in notes(helm, tmp_path, "webhook.clientCA.secretName=ca")
    assert warning not in notes(helm, tmp_path, "webhook.evictionInterception.enabled=false")


def test_the_notes_warn_when_the_webhook_has_no_ca(helm: Path, tmp_path: Path) -> None:
    warning = "No tls.caBundle was given"
    assert warning in notes(helm, tmp_path, "certManager.enabled=false")
    assert warning not in notes(helm, tmp_path, "certManager.enabled=false", "tls.caBundle=Q0E=")
    assert warning not in notes(helm, tmp_path)


def test_scheduling_values_reach_every_component(helm: Path) -> None:
    objects = helm_template(
        helm,
        values=[
            "priorityClassName=system-cluster-critical",
            "nodeSelector.pool=infra",
            "tolerations[0].key=infra",
            "tolerations[0].operator=Exists",
        ],
    )
    for component in ("controller", "webhook", "extender"):
        pod = one(objects, "Deployment", f"berth-{component}")["spec"]["template"]["spec"]
        assert pod["priorityClassName"] == "system-cluster-critical"
        assert pod["nodeSelector"] == {"pool": "infra"}
        assert pod["tolerations"] == [{"key": "infra", "operator": "Exists"}]
    plain = one(helm_template(helm), "Deployment", "berth-webhook")["spec"]["template"]["spec"]
    assert not {"priorityClassName", "nodeSelector", "tolerations"} & set(plain)


def test_network_policies_admit_only_the_sources_given(helm: Path) -> None:
    objects = helm_template(helm, values=["networkPolicy.from.webhook[0].ipBlock.cidr=10.0.0.0/24"])
    [webhook_rule] = one(objects, "NetworkPolicy", "berth-webhook")["spec"]["ingress"]
    assert webhook_rule["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    [extender_rule] = one(objects, "NetworkPolicy", "berth-extender")["spec"]["ingress"]
    assert "from" not in extender_rule
    deny = one(objects, "NetworkPolicy", "berth-default-deny-ingress")
    # Other pods of a shared release namespace are not cut off.
    assert deny["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "berth"}}


@pytest.mark.parametrize(
    ("values", "exclude"),
    [
        ([], ["kube-system", "berth-system", "ops"]),
        (["controller.config.namespaces.exclude=null"], ["ops"]),
        (["controller.config.namespaces=null"], ["ops"]),
        (["controller.config.namespaces.exclude={ops}"], ["ops"]),
    ],
)
def test_the_release_namespace_is_never_migrated_from(
    helm: Path, tmp_path: Path, values: list[str], exclude: list[str]
) -> None:
    """The webhook never sees the release namespace, so a ReservationFirst job for a
    pod there could never bind its Reservation: the controller leaves it out."""
    objects = helm_template(helm, namespace="ops", values=values)
    [config_map] = [o for o in objects if o["kind"] == "ConfigMap"]
    config = tmp_path / "config.yaml"
    config.write_text(config_map["data"]["config.yaml"])
    namespaces = load_args(config).namespaces
    assert namespaces is not None
    assert namespaces.exclude == exclude


def test_the_uninstall_hook_aborts_every_migration_and_waits(helm: Path) -> None:
    objects = helm_template(
        helm, values=["uninstall.timeoutSeconds=300", "priorityClassName=system-cluster-critical"]
    )
    hooks = [o for o in objects if o["metadata"]["name"] == "berth-uninstall"]
    assert {o["kind"] for o in hooks} == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"
    }  # fmt: skip
    for hook in hooks:
        annotations = hook["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        # A failed Job's log is printed by helm uninstall.
        if hook["kind"] == "Job":
            assert annotations["helm.sh/hook-output-log-policy"] == "hook-failed"
        # The rights exist before the Job that uses them, and go once it succeeded.
        assert annotations["helm.sh/hook-weight"] == ("0" if hook["kind"] == "Job" else "-1")
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    job = one(objects, "Job", "berth-uninstall")
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["args"] == ["migrate", "abort", "--all", "--wait", "--timeout", "300s"]
    assert job["spec"]["activeDeadlineSeconds"] == 360
    assert job["spec"]["backoffLimit"] == 0
    assert pod["serviceAccountName"] == "berth-uninstall"
    assert pod["priorityClassName"] == "system-cluster-critical"
    rules = one(objects, "ClusterRole", "berth-uninstall")["rules"]
    rights = {(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]}
    assert rights == {
        ("podmigrationjobs", "get"),
        ("podmigrationjobs", "list"),
        ("podmigrationjobs/status", "patch"),
        ("reservations", "list"),
        ("pods", "list"),
        ("pods", "get"),
    }
    off = helm_template(helm, values=["uninstall.abortMigrations=false"])
    assert not [o for o in off if o["metadata"]["name"] == "berth-uninstall"]
