"""Berth's components run as their own ServiceAccounts, with exactly the rights their code
uses, and nobody gets more from Berth than their own RBAC gives them.

The local cluster applies manifests/rbac as an install would, and starts every component
with a token of its ServiceAccount (devtools/accounts.py). What the API server's RBAC
then allows each ServiceAccount is compared with the allow-lists below, both ways: a
grant the code does not use fails as surely as a missing one.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.e2e.kube import Cluster
from tests.e2e.migrate import deployment, job_manifest, leftovers, phase_is, ready_pods

pytestmark = pytest.mark.e2e

NAMESPACE = "berth-system"
COMPONENTS = ("controller", "webhook", "extender")
KOORD = "scheduling.koordinator.sh"
READ = {"get", "list", "watch"}

# (resource as `kubectl auth can-i --list` names it, resourceName or "") → verbs.
Grants = Mapping[tuple[str, str], set[str]]

# What each ServiceAccount may do everywhere (its ClusterRole), with the code that uses it.
CLUSTER_WIDE: dict[str, Grants] = {
    "berth-controller": {
        # Informers; the job's reservationRef and admission annotations (jobs.py).
        (f"podmigrationjobs.{KOORD}", ""): READ | {"patch", "delete"},
        (f"podmigrationjobs.{KOORD}/status", ""): {"update"},
        # Create, open (annotation patch) and delete the job's Reservation.
        (f"reservations.{KOORD}", ""): READ | {"create", "patch", "delete"},
        (f"reservations.{KOORD}/status", ""): {"update"},
        # Placeholders are owned by their Reservation with blockOwnerDeletion.
        (f"reservations.{KOORD}/finalizers", ""): {"update"},
        # Placeholders (create/delete), ungating and SoftEviction (patch), Delete policy.
        ("pods", ""): READ | {"create", "patch", "delete"},
        # The replacement's nomination to the reserved node at handover.
        ("pods/status", ""): {"patch"},
        ("pods/eviction", ""): {"create"},
        # The berth.sh/migrating label the webhook's namespaceSelector requires.
        ("namespaces", ""): READ | {"patch"},
        # Arbitration's caches; where a pod's volumes may be used (its Reservation).
        ("nodes", ""): READ,
        ("persistentvolumes", ""): READ,
        ("replicasets.apps", ""): READ,
        ("deployments.apps", ""): READ,
        ("statefulsets.apps", ""): READ,
        ("poddisruptionbudgets.policy", ""): READ,
        # Arbitration's caches; the placeholders' non-preempting classes (create).
        ("priorityclasses.scheduling.k8s.io", ""): READ | {"create"},
        # berth/kube/events.py: an Event told again has its count patched.
        ("events", ""): {"create", "patch"},
    },
    "berth-webhook": {
        # The candidates' cache, a fresh read before claiming, the claim itself (patch).
        (f"reservations.{KOORD}", ""): READ | {"patch"},
        # The top-level workload of a ReplicaSet's pod.
        ("replicasets.apps", ""): {"get"},
        # Eviction interception: the job for the pod (create; on AlreadyExists, get; the
        # requester's jobs for a StatefulSet pod's name, list by label), the pod an
        # eviction names (the review carries only its name), an Event on it; the pods
        # carrying a claim (list, by its label) before it is taken over.
        (f"podmigrationjobs.{KOORD}", ""): {"create", "get", "list"},
        ("pods", ""): {"get", "list"},
        # Whether the node of a replacement evicted again refuses it (being drained).
        ("nodes", ""): {"get"},
        # The label of an eviction's namespace, read again on the labelled path.
        ("namespaces", ""): {"get"},
        ("events", ""): {"create", "patch"},
    },
    "berth-extender": {
        (f"reservations.{KOORD}", ""): READ,
        ("pods", ""): READ,
        ("nodes", ""): READ,
    },
}

# What each ServiceAccount may do in berth-system beyond that: the controller's Lease
# and admission key.
IN_BERTH_NAMESPACE: dict[str, Grants] = {
    "berth-controller": {
        ("leases.coordination.k8s.io", ""): {"create"},
        ("leases.coordination.k8s.io", "berth-controller"): {"get", "update"},
        # The admission key (controller/signing.py): created if missing, then read.
        ("secrets", ""): {"create"},
        ("secrets", "berth-admission-key"): {"get"},
    },
    "berth-webhook": {},
    "berth-extender": {},
}

ROW = re.compile(r"^(\S*)\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s*$")

Rule = tuple[str, str, str, str]
"""(resource, non-resource URL, resourceName, verb): one effective permission."""


def effective(cluster: Cluster, user: str, namespace: str) -> set[Rule]:
    """What `user` may do in `namespace` (cluster-wide grants included), one rule per verb,
    as `kubectl auth can-i --list` reports it."""
    listed = cluster.kubectl("auth", "can-i", "--list", f"--as={user}", f"--namespace={namespace}")
    rules = set()
    for line in listed.stdout.splitlines()[1:]:
        match = ROW.match(line)
        assert match, f"unexpected line: {line!r}"
        resource, urls, names, verbs = match.groups()
        for url in urls.split() or [""]:
            for name in names.split() or [""]:
                rules |= {(resource, url, name, verb) for verb in verbs.split()}
    return rules


def expand(*grants: Grants) -> set[Rule]:
    return {
        (resource, "", name, verb)
        for grant in grants
        for (resource, name), verbs in grant.items()
        for verb in verbs
    }


@pytest.mark.parametrize("account", sorted(CLUSTER_WIDE))
def test_each_service_account_may_do_exactly_what_its_component_does(
    cluster: Cluster, namespace: str, account: str
) -> None:
    # What every authenticated ServiceAccount may do (discovery, self-reviews): a
    # ServiceAccount Berth never bound anything to.
    baseline = effective(cluster, f"system:serviceaccount:{namespace}:default", namespace)
    user = f"system:serviceaccount:{NAMESPACE}:{account}"
    cluster_wide = expand(CLUSTER_WIDE[account])
    # A namespace of users' workloads, "default" (where Events about cluster-scoped jobs
    # and Reservations go) and Berth's own namespace.
    for where, allowed in (
        (namespace, cluster_wide),
        ("default", cluster_wide),
        (NAMESPACE, cluster_wide | expand(IN_BERTH_NAMESPACE[account])),
    ):
        granted = effective(cluster, user, where) - baseline
        assert granted == allowed, (
            f"{account} in {where}: "
            f"beyond the allow-list {sorted(granted - allowed)}, "
            f"missing {sorted(allowed - granted)}"
        )


def kubectl_as(cluster: Cluster, kubeconfig: Path, *args: str) -> str:
    assert cluster.local.binaries is not None
    result = subprocess.run(
        [str(cluster.local.binaries.kubectl), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
    )
    return result.stdout.strip() or result.stderr.strip()


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_component_runs_as_its_service_account(cluster: Cluster, component: str) -> None:
    kubeconfig = cluster.local.component_kubeconfig(component)
    review = json.loads(kubectl_as(cluster, kubeconfig, "auth", "whoami", "-o", "json"))
    account = f"system:serviceaccount:{NAMESPACE}:berth-{component}"
    assert review["status"]["userInfo"]["username"] == account
    assert kubectl_as(cluster, kubeconfig, "auth", "can-i", "list", "secrets", "-A") == "no"
    # Every running replica of the component was started with that kubeconfig.
    replicas = [c for c in cluster.local.running() if c.name.startswith(f"berth-{component}")]
    assert replicas
    for replica in replicas:
        argv = Path(f"/proc/{replica.pid}/cmdline").read_bytes().split(b"\0")
        assert f"--kubeconfig={kubeconfig}".encode() in argv, (replica.name, argv)


def test_a_migration_needs_no_right_the_service_accounts_lack(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    name, manifest = job_manifest(pod)
    cluster.apply(manifest)
    job = cluster.wait(
        lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the migration to end"
    )
    assert job["status"]["phase"] == "Succeed", job["status"]
    assert not any(leftovers(cluster, namespace).values())
    refused = [
        f"{log.name}: {line}"
        for log in sorted(cluster.local.logs.glob("berth-*.log"))
        for line in log.read_text(errors="replace").splitlines()
        # Refusals of authorization only: an admission plugin's 403 (a PriorityClass its
        # informer has not seen yet, retried) is not a missing right.
        if re.search(r"HTTP 401\b", line) or re.search(r"HTTP 403\b.*\bcannot \w+ resource", line)
    ]
    assert not refused, "\n".join(refused)


# --- the roles for users ------------------------------------------------------


@pytest.fixture
def user(cluster: Cluster) -> Iterator[str]:
    """A user of no rights, whose bindings go when the test ends."""
    name = f"user-{uuid.uuid4().hex[:6]}"
    yield name
    for binding in cluster.get("clusterrolebindings", "-l", f"berth-test-user={name}")["items"]:
        cluster.kubectl("delete", "clusterrolebinding", binding["metadata"]["name"])


def bind(cluster: Cluster, user: str, role: str, *, namespace: str | None = None) -> None:
    """Bind `role` to `user`: a RoleBinding in `namespace`, else a ClusterRoleBinding."""
    kind = "rolebinding" if namespace else "clusterrolebinding"
    where = [f"--namespace={namespace}"] if namespace else []
    cluster.kubectl(
        "create", kind, f"{user}-{role}", f"--clusterrole={role}", f"--user={user}", *where
    )
    cluster.kubectl("label", kind, f"{user}-{role}", f"berth-test-user={user}", *where)


def can(cluster: Cluster, user: str, verb: str, resource: str, *extra: str) -> bool:
    """Whether `user` may: for a cluster-scoped resource, as asked with no namespace (-A);
    `can-i -n NS` would count the user's RoleBindings in NS, which a real request for a
    cluster-scoped object never does."""
    answer = cluster.kubectl(
        "auth", "can-i", verb, resource, f"--as={user}", *(extra or ["-A"]), check=False
    )
    return answer.stdout.strip() == "yes"


def refused(cluster: Cluster, user: str, *args: str, input: str | None = None) -> bool:
    """Whether the API server answers Forbidden to `kubectl ARGS` as `user`."""
    answer = cluster.kubectl(*args, f"--as={user}", input=input, check=False)
    return answer.returncode != 0 and "Forbidden" in answer.stderr


PMJ = f"podmigrationjobs.{KOORD}"
RESERVATIONS = f"reservations.{KOORD}"


def test_namespace_admins_get_nothing_of_berth(cluster: Cluster, namespace: str, user: str) -> None:
    # Jobs and Reservations are cluster-scoped: a RoleBinding grants nothing on them,
    # whatever the role aggregates (README: Who may migrate pods).
    bind(cluster, user, "admin", namespace=namespace)
    cluster.wait(lambda: can(cluster, user, "delete", "pods", "-n", namespace), what="the binding")
    _, job = job_manifest({"metadata": {"namespace": namespace, "name": "any"}})
    assert refused(cluster, user, "create", "--dry-run=server", "-f", "-", input=job)
    assert refused(cluster, user, "get", "pmj")
    assert refused(cluster, user, "get", "reservations")
    for verb in ("create", "delete", "list"):
        assert not can(cluster, user, verb, PMJ), verb


def test_cluster_wide_viewers_see_jobs_and_reservations(cluster: Cluster, user: str) -> None:
    bind(cluster, user, "view")
    # The built-in view role takes Berth's rules in through its aggregation label.
    cluster.wait(lambda: can(cluster, user, "list", PMJ), what="view to aggregate berth-view")
    assert not refused(cluster, user, "get", "pmj")
    assert not refused(cluster, user, "get", "reservations")
    assert not can(cluster, user, "create", PMJ)
    assert not can(cluster, user, "patch", PMJ, "--subresource=status")


def test_the_operator_role_runs_jobs_and_nothing_else(cluster: Cluster, user: str) -> None:
    bind(cluster, user, "berth-operator")
    cluster.wait(lambda: can(cluster, user, "create", PMJ), what="the binding")
    for verb in ("get", "list", "watch", "delete", "patch"):
        assert can(cluster, user, verb, PMJ), verb
    assert can(cluster, user, "patch", PMJ, "--subresource=status", "-A")  # abort
    assert can(cluster, user, "list", RESERVATIONS)
    # The controller creates Reservations and evicts; the operator does neither directly.
    assert not can(cluster, user, "create", RESERVATIONS)
    assert not can(cluster, user, "update", PMJ, "--subresource=status", "-A")
    assert not can(cluster, user, "create", "pods", "--subresource=eviction", "-A")


# --- what the API server lets the controller write, beyond RBAC -------------------

CONTROLLER = "--as=system:serviceaccount:berth-system:berth-controller"


def placeholder(**spec: object) -> dict[str, object]:
    """A pod shaped as controller/build.py makes placeholders, with `spec` changed."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "berth-placeholder-x-",
            "labels": {"berth.sh/reservation": "x"},
        },
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65535},
            "containers": [
                {
                    "name": "reserve",
                    "image": "registry.k8s.io/pause:3.10",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
            **spec,
        },
    }


POD_POLICY = Path(__file__).resolve().parents[2] / "manifests" / "pod-policy"


@pytest.fixture(scope="module")
def pod_policy(cluster: Cluster) -> Iterator[None]:
    """The opt-in pod policy (manifests/pod-policy), in force for the module's tests that
    ask for it: applied, then waited for until the API server refuses a pod that is no
    placeholder, and deleted after them."""
    cluster.kubectl("apply", "-k", str(POD_POLICY))
    any_pod = json.dumps(placeholder(volumes=[{"name": "x", "emptyDir": {}}]))

    def in_force() -> bool:
        return "placeholder" in as_controller(
            cluster, "create", "-n", "default", "-f", "-", input=any_pod
        )

    cluster.wait(in_force, what="the pod policy to be in force")
    yield
    cluster.kubectl("delete", "-k", str(POD_POLICY), "--wait")


def as_controller(cluster: Cluster, *args: str, input: str | None = None) -> str:
    """What the API server answers the controller's ServiceAccount (a server dry run):
    "" when it allows the request, else its refusal."""
    result = cluster.kubectl(CONTROLLER, *args, "--dry-run=server", input=input, check=False)
    return "" if result.returncode == 0 else result.stderr


@pytest.mark.parametrize(
    ("change", "allowed"),
    [
        pytest.param({}, True, id="a placeholder"),
        pytest.param(
            {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, False, id="hostPath"
        ),
        pytest.param({"hostNetwork": True}, False, id="host network"),
        pytest.param(
            {
                "containers": [
                    {
                        "name": "reserve",
                        "image": "busybox",
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ]
            },
            False,
            id="another image",
        ),
        pytest.param({"automountServiceAccountToken": True}, False, id="a token"),
        pytest.param(
            {"containers": [{"name": "x", "image": "busybox", "command": ["sh"]}]},
            False,
            id="a command",
        ),
        pytest.param(
            {
                "containers": [
                    {
                        "name": "x",
                        "image": "registry.k8s.io/pause:3.10",
                        "securityContext": {
                            "privileged": True,
                            "allowPrivilegeEscalation": True,
                        },
                    }
                ]
            },
            False,
            id="privileged",
        ),
    ],
)
@pytest.mark.usefixtures("pod_policy")
def test_the_controller_may_create_placeholders_and_no_other_pod(
    cluster: Cluster, namespace: str, change: dict[str, object], allowed: bool
) -> None:
    """RBAC lets the controller create any pod anywhere; the pod policy
    (manifests/pod-policy) lets it create only what a placeholder is, whatever a job's
    template or a stolen token asks for."""
    refused = as_controller(
        cluster, "create", "-n", namespace, "-f", "-", input=json.dumps(placeholder(**change))
    )
    assert (refused == "") == allowed, refused
    if not allowed:
        assert "berth-controller may only create placeholder pods" in refused


@pytest.mark.usefixtures("pod_policy")
def test_the_controller_changes_nothing_of_a_pod_or_namespace_but_its_own_marks(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    name = f"pod/{pod['metadata']['name']}"
    container = pod["spec"]["containers"][0]["name"]
    soft = "scheduling.koordinator.sh/soft-eviction={}"
    assert as_controller(cluster, "annotate", "-n", namespace, name, soft) == ""
    # kubectl reads pods/status before patching it, which the controller may not: the
    # read is granted here, in the test's namespace.
    reader = ["-n", namespace, "status-reader"]
    cluster.kubectl("create", "role", *reader, "--verb=get", "--resource=pods/status")
    account = "--serviceaccount=berth-system:berth-controller"
    cluster.kubectl("create", "rolebinding", *reader, "--role=status-reader", account)
    gated = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gated"},
        "spec": {
            "schedulingGates": [{"name": "example.com/hold"}],
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    cluster.apply(json.dumps(gated), namespace)
    status = ["patch", "-n", namespace, "pod/gated", "--subresource=status", "--type=merge", "-p"]
    nominate = '{"status": {"nominatedNodeName": "node-1"}}'  # as for a replacement
    cluster.wait(lambda: as_controller(cluster, *status, nominate) == "", what="the nomination")
    for change in (
        ["set", "image", "-n", namespace, name, f"{container}=evil"],
        ["label", "-n", namespace, name, "app-"],
        ["annotate", "-n", namespace, name, "other=1"],
        # pods/status keeps the spec and the owners, not the labels or annotations.
        [*status, '{"metadata": {"labels": {"app": "other"}}}'],
    ):
        refused = as_controller(cluster, *change)
        assert "may only change a pod's scheduling gates" in refused, (change, refused)
    for body in (
        '{"status": {"phase": "Failed"}}',
        '{"status": {"conditions": []}}',
        '{"status": {"podIPs": [{"ip": "10.9.9.9"}], "podIP": "10.9.9.9"}}',
    ):
        refused = as_controller(cluster, *status, body)
        assert "may change no pod status but status.nominatedNodeName" in refused, (body, refused)
    assert as_controller(cluster, "label", "namespace", namespace, "berth.sh/migrating=true") == ""
    ghost = {"apiVersion": "v1", "kind": "Node", "name": "gone", "uid": str(uuid.uuid4())}
    for change in (
        ["label", "namespace", namespace, "pod-security.kubernetes.io/enforce=privileged"],
        ["patch", "namespace", namespace, "--type=merge", "-p",
         '{"metadata": {"finalizers": ["example.com/hold"]}}'],
    ):  # fmt: skip
        refused = as_controller(cluster, *change)
        assert "may only change a namespace's berth.sh/migrating label" in refused, change
    # An owner that does not exist would have the garbage collector delete the namespace.
    # This cluster runs OwnerReferencesPermissionEnforcement, which refuses it first (the
    # controller may not delete namespaces); the policy holds where that plugin is off.
    owned = {"metadata": {"ownerReferences": [ghost]}}
    refused = as_controller(cluster, "patch", "namespace", namespace, "--type=merge", "-p",
                            json.dumps(owned))  # fmt: skip
    assert "cannot set an ownerRef" in refused or "berth.sh/migrating label" in refused


@pytest.fixture
def twin_class(cluster: Cluster) -> Iterator[str]:
    """A placeholders' PriorityClass, as the controller makes them."""
    name = f"berth-non-preempting-{uuid.uuid4().int % 100_000 + 100_000}"
    body = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": int(name.rsplit("-", 1)[1]),
        "preemptionPolicy": "Never",
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(body))
    yield name
    cluster.kubectl("delete", "priorityclass", name, "--wait=false", check=False)


@pytest.mark.usefixtures("pod_policy")
def test_only_the_controller_creates_pods_under_a_placeholder_class(
    cluster: Cluster, namespace: str, twin_class: str
) -> None:
    """Each placeholder class carries the value of the class of a pod Berth migrated:
    under the pod policy no one else's pod may name one, past the rules of the class it
    copies."""
    under = placeholder(priorityClassName=twin_class)
    assert (
        as_controller(cluster, "create", "-n", namespace, "-f", "-", input=json.dumps(under)) == ""
    )

    def tenant_creates(spec: dict[str, object]) -> subprocess.CompletedProcess[str]:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "climber"},
            "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]} | spec,
        }
        return cluster.kubectl("create", "-n", namespace, "-f", "-", "--dry-run=server",
                               input=json.dumps(pod), check=False)  # fmt: skip

    refused = tenant_creates({"priorityClassName": twin_class})
    assert refused.returncode != 0
    assert "are for Berth's placeholders" in refused.stderr
    assert tenant_creates({}).returncode == 0


@pytest.mark.parametrize(
    ("name", "extra", "allowed"),
    [
        ("berth-non-preempting-7", {}, True),
        ("berth-non-preempting-8", {"globalDefault": True}, False),
        ("berth-non-preempting-9", {"preemptionPolicy": "PreemptLowerPriority"}, False),
        ("cluster-top", {}, False),
    ],
)
def test_the_controller_creates_only_non_preempting_classes(
    cluster: Cluster, name: str, extra: dict[str, object], allowed: bool
) -> None:
    body = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": 7,
        "preemptionPolicy": "Never",
        **extra,
    }
    refused = as_controller(cluster, "create", "-f", "-", input=json.dumps(body))
    assert (refused == "") == allowed, refused


@pytest.mark.usefixtures("pod_policy")
def test_a_migration_runs_under_the_pod_policy(cluster: Cluster, namespace: str) -> None:
    """Everything the controller does to pods in a ReservationFirst migration (the
    placeholder, the replacement's ungating) is what the pod policy allows."""
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    name, manifest = job_manifest(pod)
    cluster.apply(manifest)
    job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job")
    assert job["status"]["phase"] == "Succeed", job["status"]
    assert not any(leftovers(cluster, namespace).values())


# --- what the API server lets the webhook write, beyond RBAC ------------------------

WEBHOOK = "--as=system:serviceaccount:berth-system:berth-webhook"


@pytest.fixture
def hand_made(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A Reservation no node can hold (its placeholder stays Pending), made by hand."""
    name = f"hand-made-{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": name, "annotations": {"example.com/note": "kept"}},
        "spec": {
            "template": {
                "metadata": {"namespace": namespace},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": "no-such-node"},
                    "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
            "owners": [{"object": {"name": "web-1", "namespace": namespace}}],
            "ttl": "10m",
        },
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(body))
    yield name
    cluster.kubectl("delete", "reservation", name, "--wait=false", check=False)


def as_webhook(cluster: Cluster, *args: str) -> str:
    """What the API server answers the webhook's ServiceAccount (a server dry run)."""
    result = cluster.kubectl(WEBHOOK, *args, "--dry-run=server", check=False)
    return "" if result.returncode == 0 else result.stderr


def test_the_webhook_changes_nothing_of_a_reservation_but_its_claim(
    cluster: Cluster, hand_made: str
) -> None:
    """RBAC lets the webhook patch any Reservation; the policy holds it to the claim, so
    its token (the component on the network) cannot hand reserved capacity elsewhere."""
    name = f"reservation/{hand_made}"
    token = uuid.uuid4().hex
    assert as_webhook(cluster, "annotate", name, f"berth.sh/claim={token}") == ""
    owners = {"spec": {"owners": [{"object": {"name": "other", "namespace": "default"}}]}}
    for change in (
        ["annotate", name, "berth.sh/consumable=true"],
        ["annotate", name, "example.com/note-"],
        ["label", name, "team=other"],
        ["patch", name, "--type=merge", "-p", json.dumps(owners)],
        ["patch", name, "--type=merge", "-p", '{"spec": {"ttl": "1000h"}}'],
    ):
        refused = as_webhook(cluster, *change)
        assert "may only change a Reservation's berth.sh/claim annotation" in refused, (
            change,
            refused,
        )
