"""Static checks of the configuration the manifests carry: the controller's config file,
the webhook's admission settings, the serving certificate, the scheduler's extender
entry and the pinned dependencies."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.requirements import Requirement

from berth.api import keys
from berth.settings import DEFAULT_SCHEDULER_NAMES
from devtools import render
from tests.unit.manifests import (
    MANIFESTS,
    NAMESPACE,
    ROOT,
    kustomization,
    objects,
    one,
    the_container,
)
from webhook.app import EVICTION_PATH, UNLABELLED_EVICTION_PATH

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
BERTH_KEYS = {"placeholderImage", "maxMigratingGlobally", "evictionInterception"}


def test_controller_config_writes_out_every_key_with_the_design_defaults() -> None:
    config = yaml.safe_load((MANIFESTS / "controller" / "config.yaml").read_text())
    assert set(config) == SEED_KEYS | BERTH_KEYS
    assert set(config["namespaces"]) == {"include", "exclude"}
    assert set(config["arbitrationArgs"]) == {"enabled", "interval"}
    assert set(config["evictionInterception"]) == {"allNamespaces", "requesters", "keepFinished"}
    # Where the design departs from the seeds: a vanilla scheduler, with both names.
    assert config["schedulerNames"] == ["default-scheduler", "koord-scheduler"]
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
    # Only namespaces the controller labelled for a migration, never the control plane's
    # or Berth's own; the local cluster registers the same selector.
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", NAMESPACE],
            },
            {"key": keys.MIGRATING_LABEL, "operator": "In", "values": ["true"]},
        ]
    }
    assert hook["namespaceSelector"] == render.namespace_selector(
        skip_namespaces=["kube-system", NAMESPACE], scope=render.Scope.DEFAULT
    )
    service = hook["clientConfig"]["service"]
    assert service == {
        "name": "berth-webhook",
        "namespace": NAMESPACE,
        "path": "/mutate-pod",
        "port": 443,
    }
    one(found, "Service", service["name"])


def test_webhook_is_called_only_for_pods_a_workload_controller_creates() -> None:
    """The manifest's match condition names exactly the users berth.protocol recognises as
    a workload controller; the strict component leaves it in place."""
    [hook] = one(objects(MANIFESTS / "webhook"), "MutatingWebhookConfiguration", "berth")[
        "webhooks"
    ]
    assert hook["matchConditions"] == [render.created_by_a_workload_controller()]
    [operation] = yaml.safe_load(kustomization(STRICT)["patches"][0]["patch"])
    assert not operation["path"].startswith("/webhooks/0/matchConditions")


def test_webhook_work_ends_before_the_api_server_stops_waiting() -> None:
    """A claim written after the API server gave up (timeoutSeconds) would bind no pod:
    the webhook's deadline is shorter, with room for the answer to travel."""
    [hook] = one(objects(MANIFESTS / "webhook"), "MutatingWebhookConfiguration", "berth")[
        "webhooks"
    ]
    args = the_container("webhook")["args"]
    deadline = float(args[args.index("--request-deadline") + 1])
    assert deadline <= hook["timeoutSeconds"] - 1


def test_eviction_webhook_never_blocks_an_eviction() -> None:
    """pods/eviction CREATE, fail-open, no job on a dry run; two entries whose namespaces
    never overlap (an eviction reaches the webhook once), each on the path that tells
    the webhook which one called; the local cluster registers the same settings."""
    config = one(
        objects(MANIFESTS / "webhook"), "ValidatingWebhookConfiguration", "berth-evictions"
    )
    mutating = one(objects(MANIFESTS / "webhook"), "MutatingWebhookConfiguration", "berth")
    annotation = "cert-manager.io/inject-ca-from"
    assert (
        config["metadata"]["annotations"][annotation]
        == mutating["metadata"]["annotations"][annotation]
    )
    labelled, unlabelled = config["webhooks"]
    local = render.eviction_webhook_configuration(
        urls=["https://127.0.0.1:1"], ca_bundle="x", skip_namespaces=["kube-system", NAMESPACE]
    )
    assert local["metadata"]["name"] == config["metadata"]["name"]
    for hook, path, local_hook in zip(
        (labelled, unlabelled),
        (EVICTION_PATH, UNLABELLED_EVICTION_PATH),
        local["webhooks"],
        strict=True,
    ):
        assert hook["rules"] == [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods/eviction"],
                "operations": ["CREATE"],
                "scope": "Namespaced",
            }
        ]
        assert hook["failurePolicy"] == "Ignore"
        assert hook["sideEffects"] == "NoneOnDryRun"
        assert hook["clientConfig"]["service"] == {
            "name": "berth-webhook",
            "namespace": NAMESPACE,
            "path": path,
            "port": 443,
        }
        assert local_hook["clientConfig"]["url"] == f"https://127.0.0.1:1{path}"
        same = {k: v for k, v in hook.items() if k != "clientConfig"}
        assert same == {k: v for k, v in local_hook.items() if k != "clientConfig"}
    assert labelled["namespaceSelector"]["matchExpressions"][1] == {
        "key": keys.INTERCEPT_EVICTIONS,
        "operator": "In",
        "values": ["true"],
    }
    assert unlabelled["namespaceSelector"]["matchExpressions"][1] == {
        "key": keys.INTERCEPT_EVICTIONS,
        "operator": "NotIn",
        "values": ["true"],
    }
    args = the_container("webhook")["args"]
    assert float(args[args.index("--request-deadline") + 1]) <= labelled["timeoutSeconds"] - 1


def test_webhook_reads_the_controller_configuration_file() -> None:
    """One configuration: the webhook mounts the controller's ConfigMap."""
    webhook_args = the_container("webhook")["args"]
    controller_args = the_container("controller")["args"]
    path = webhook_args[webhook_args.index("--config") + 1]
    assert path == controller_args[controller_args.index("--config") + 1]
    deployment = one(objects(MANIFESTS / "webhook"), "Deployment", "berth-webhook")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "berth-controller-config"
    [mount] = [m for m in the_container("webhook")["volumeMounts"] if m["name"] == "config"]
    assert path.startswith(mount["mountPath"] + "/")


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
        # Called only for the pods that request Berth's extended resource.
        "managedResources": [{"name": keys.RESERVATION_RESOURCE, "ignoredByScheduler": True}],
    }
    # The local cluster configures its scheduler the same way.
    [local] = render.berth_extenders(
        url=extender["urlPrefix"], ca_bundle="x", scope=render.Scope.DEFAULT
    )
    assert {**local, "tlsConfig": extender["tlsConfig"]} == extender
    # The URL names the extender's Service and port.
    url = urlsplit(extender["urlPrefix"])
    service = one(objects(MANIFESTS / "extender"), "Service", "berth-extender")
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.port == service["spec"]["ports"][0]["port"]
    assert extender["tlsConfig"].keys() == {"caData"}


def test_scheduler_config_runs_a_profile_per_default_scheduler_name() -> None:
    config = yaml.safe_load((SCHEDULER / "kube-scheduler-config.yaml").read_text())
    # Same plugins in each (the defaults): kube-scheduler gives the extenders to every profile.
    assert config["profiles"] == [{"schedulerName": name} for name in DEFAULT_SCHEDULER_NAMES]
    assert DEFAULT_SCHEDULER_NAMES == ("default-scheduler", "koord-scheduler")


STRICT = MANIFESTS / "strict"


def test_strict_scheduler_config_calls_the_extender_for_every_pod() -> None:
    default = yaml.safe_load((SCHEDULER / "kube-scheduler-config.yaml").read_text())
    strict = yaml.safe_load((STRICT / "kube-scheduler-config.yaml").read_text())
    [extender, ranking] = strict["extenders"]
    assert "managedResources" not in extender
    # The default entry split in two: filter and preempt for every pod, prioritize for
    # Berth's pods only.
    split = {"prioritizeVerb", "weight", "managedResources"}
    assert extender == {
        key: value for key, value in default["extenders"][0].items() if key not in split
    }
    assert ranking == {
        key: value
        for key, value in default["extenders"][0].items()
        if key not in {"filterVerb", "preemptVerb"}
    }
    # Berth's pods still request the resource no node advertises: NodeResourcesFit must
    # leave it unchecked, as managedResources' ignoredByScheduler does in the default scope.
    assert [profile["schedulerName"] for profile in strict["profiles"]] == list(
        DEFAULT_SCHEDULER_NAMES
    )
    for profile in strict["profiles"]:
        assert profile["pluginConfig"] == [
            {"name": "NodeResourcesFit", "args": {"ignoredResources": [keys.RESERVATION_RESOURCE]}}
        ]
    assert render.ignored_resources(render.Scope.STRICT) == [keys.RESERVATION_RESOURCE]
    local = render.berth_extenders(
        url=extender["urlPrefix"], ca_bundle="x", scope=render.Scope.STRICT
    )
    assert [{**entry, "tlsConfig": extender["tlsConfig"]} for entry in local] == [
        extender,
        ranking,
    ]


def test_strict_component_calls_the_webhook_in_every_namespace() -> None:
    component = kustomization(STRICT)
    assert component["kind"] == "Component"
    [patch] = component["patches"]
    assert patch["target"] == {"kind": "MutatingWebhookConfiguration", "name": "berth"}
    [operation] = yaml.safe_load(patch["patch"])
    assert operation["op"] == "replace"
    assert operation["path"] == "/webhooks/0/namespaceSelector"
    assert operation["value"] == render.namespace_selector(
        skip_namespaces=["kube-system", NAMESPACE], scope=render.Scope.STRICT
    )


# --- image ------------------------------------------------------------------


def pins(text: str) -> dict[str, str]:
    """name → version of each `name==version` line (hash options and comments aside)."""
    found = {}
    for line in text.replace("\\\n", " ").splitlines():
        requirement = line.split("#")[0].split("--hash")[0].strip()
        if requirement:
            name, _, version = requirement.partition("==")
            assert version, f"not pinned: {requirement}"
            found[name.strip().lower().replace("_", "-")] = version.strip()
    return found


def hashes(text: str) -> dict[str, list[str]]:
    """name → the sha256 digests listed for it (a requirement and its continuation lines)."""
    found: dict[str, list[str]] = {}
    for entry in text.replace("\\\n", " ").splitlines():
        requirement = entry.split("#")[0].split("--hash")[0].strip()
        if requirement:
            name = requirement.partition("==")[0].lower().replace("_", "-")
            found[name] = re.findall(r"--hash=sha256:(\S+)", entry)
    return found


def test_requirements_lock_pins_every_runtime_dependency() -> None:
    # The image installs the lock, then the project without dependencies: a
    # dependency missing from the lock would be missing from the image.
    locked = pins((ROOT / "requirements.lock").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dependency in map(Requirement, project["dependencies"]):
        name = dependency.name.lower().replace("_", "-")
        assert name in locked, f"{dependency.name} is not in requirements.lock"
        assert dependency.specifier.contains(locked[name]), (dependency, locked[name])


def test_the_hashed_lock_has_the_same_pins_each_with_its_hashes() -> None:
    text = (ROOT / "requirements-hashed.lock").read_text()
    assert pins(text) == pins((ROOT / "requirements.lock").read_text())
    for name, digests in hashes(text).items():
        assert digests, f"{name} has no hash"
        for digest in digests:
            assert re.fullmatch(r"[0-9a-f]{64}", digest), (name, digest)
    # Nothing the image installs brings a package installer back.
    assert not {"pip", "setuptools", "wheel"} & set(pins(text))


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each instruction, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", dockerfile)
    lines = [line.strip() for line in joined.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_the_image_is_built_only_from_content_pinned_inputs() -> None:
    steps = instructions((ROOT / "Dockerfile").read_text())
    stages = [arguments.split() for kind, arguments in steps if kind == "FROM"]
    assert len(stages) == 2
    for stage in stages:
        assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", stage[0]), stage
    runs = [arguments for kind, arguments in steps if kind == "RUN"]
    installs = [run for run in runs if re.search(r"\bpip\b.*\binstall\b", run)]
    # Dependencies only by hash; the project from the wheel built here, offline.
    assert any(
        "--require-hashes" in run and "-r requirements-hashed.lock" in run for run in installs
    )
    for run in installs:
        assert "--require-hashes" in run or "--no-index" in run, run
        if "pip wheel" in run:
            assert "--no-build-isolation" in run, run
            assert "--no-deps" in run, run
    assert ("COPY", "requirements-hashed.lock .") in steps
    admitted = (ROOT / ".dockerignore").read_text().splitlines()
    assert "!requirements-hashed.lock" in admitted


def test_the_final_image_has_no_package_installer() -> None:
    steps = instructions((ROOT / "Dockerfile").read_text())
    final = steps[max(i for i, (kind, _) in enumerate(steps) if kind == "FROM") :]
    runs = " ".join(arguments for kind, arguments in final if kind == "RUN")
    assert re.search(r"pip uninstall --yes .*\bpip setuptools wheel\b", runs)
    assert "/usr/local/lib/python3.11/ensurepip" in runs
    # The virtualenv copied from the build stage is made without pip.
    build_runs = " ".join(arguments for kind, arguments in steps[: len(steps) - len(final)])
    assert "venv --without-pip /opt/berth" in build_runs
    assert ("USER", "65532:65532") in final
