"""The local control plane: which components run, in which order, wired how.

`up` starts etcd, kube-apiserver (with this cluster's own CA, Berth's CRDs and RBAC),
kube-controller-manager, Berth's extender, kube-scheduler configured with it, kwok and
its fake nodes, then Berth's controller and webhook; each after the previous one is
healthy. With `cert_manager`, cert-manager runs after kube-controller-manager and issues
Berth's serving certificate from manifests/cert-manager; a mirror of its Secret stands
in for the kubelet's volume, and the CA injector fills the webhook's caBundle. Berth's
components run as their own ServiceAccounts (`devtools.accounts`).
Starting and stopping processes is `devtools.processes`; the files they read are
`devtools.render`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from berth import tls
from berth.settings import DEFAULT_SCHEDULER_NAMES
from devtools import accounts, nodes, render
from devtools import binaries as go_binaries
from devtools.binaries import REPO, ensure_binaries
from devtools.processes import (
    START_TIMEOUT,
    ClusterError,
    Component,
    Processes,
    free_port,
    wait_until,
)

SERVICE_CIDR = "10.96.0.0/16"
BERTH_NAMESPACE = accounts.NAMESPACE

NODE_LEASE_SECONDS = 600
"""kwok renews each node's Lease every quarter of this (150 s; a kubelet's default is 40 s,
renewed every 10 s): 2,000 nodes then cost 13 writes a second rather than 200. The node
lifecycle controller waits as long before it calls a silent node NotReady."""

KWOK_PARALLELISM = 16
"""Node Leases, node stages and pod stages kwok works on at once (its default is 4)."""

DELETE_COLLECTION_WORKERS = 8
"""Objects the API server deletes at once in one DeleteCollection (its default is 1)."""

CLIENT_QPS, CLIENT_BURST = 200, 400
"""Client-side rate limits of kube-controller-manager and kube-scheduler (defaults 20/30 and
50/100): at the defaults, lifting the not-ready taint off 2,000 new nodes alone takes
minutes, and scheduling is held to some 25 pods a second."""


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ClusterSpec:
    """What `berth dev up` is asked for."""

    nodes: int = 3
    node_cpu: str = "8"
    node_memory: str = "16Gi"
    node_pods: int = 110
    extenders: list[dict[str, Any]] = field(default_factory=list)
    berth: bool = True
    """Also run Berth's own components against the cluster."""
    scope: render.Scope = render.Scope.DEFAULT
    """Which pods reach Berth's extender and webhook."""
    cert_manager: bool = False
    """Run cert-manager, and serve the certificate it issues (else one of this cluster's CA)."""
    profiling: bool = False
    """Serve kube-apiserver's /debug/pprof (to its admin) for CPU profiles."""


TLS_SECRET = "berth-tls"
"""The Secret of Berth's serving certificate (manifests/cert-manager/certificate.yaml)."""

CA_SECRET = "berth-ca"
"""The Secret of the Berth CA that cert-manager issues it from
(manifests/cert-manager/issuers.yaml)."""


class LocalCluster(Processes):
    """A local control plane rooted at `state_dir`."""

    def __init__(self, state_dir: Path | None = None, report: nodes.Report | None = None) -> None:
        super().__init__(state_dir)
        self.report = report or _to_stderr
        self._ca: tls.KeyPair | None = None
        self._admin: tls.KeyPair | None = None
        self._etcd_url = ""
        self._server = ""

    # ----- up -------------------------------------------------------------------------

    def up(self, spec: ClusterSpec) -> None:
        """Start every component in order, each after the previous one is healthy."""
        if self.running():
            raise ClusterError(
                f"a local cluster already runs from {self.state_dir} "
                f"(kubeconfig {self.kubeconfig}); run `berth dev down` first"
            )
        self.binaries = ensure_binaries()
        self.scope = render.Scope(spec.scope)
        self.cert_manager = spec.cert_manager
        self._reset_dirs()
        try:
            self._write_pki()
            self._start_etcd()
            self._start_apiserver(profiling=spec.profiling)
            self._install_crds()
            if spec.berth:
                accounts.install_rbac(self.kubectl)
            self._start_controller_manager()
            if spec.cert_manager:
                self._start_cert_manager()
                if spec.berth:
                    self._issue_serving_certificate()
            extenders = list(spec.extenders)
            if spec.berth:
                extenders += self._berth_extenders(self.start_extender(name="berth-extender"))
            self.start_scheduler(
                name="kube-scheduler",
                extenders=extenders,
                ignored_resources=render.ignored_resources(render.Scope(self.scope)),
            )
            self._start_kwok()
            self._create_nodes(spec)
            if spec.berth:
                self.start_controller(name="berth-controller")
                self.start_webhook(name="berth-webhook")
        except BaseException:
            self.down()
            raise

    def _reset_dirs(self) -> None:
        for directory in (self.pki, self.logs, self.state_dir / "etcd", self.tls_mount):
            if directory.exists():
                subprocess.run(["rm", "-rf", str(directory)], check=True)
        for directory in (self.pki, self.logs):
            directory.mkdir(parents=True)
        self.components = []

    def _write_pki(self) -> None:
        ca = tls.make_ca("berth-dev-ca")
        ca.write(cert_path=self.pki / "ca.crt", key_path=self.pki / "ca.key")
        tls.issue(
            ca,
            common_name="kube-apiserver",
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ip_addresses=("127.0.0.1", "10.96.0.1"),
        ).write(cert_path=self.pki / "apiserver.crt", key_path=self.pki / "apiserver.key")
        admin = tls.issue(
            ca, common_name="berth-dev-admin", organization="system:masters", client=True
        )
        admin.write(cert_path=self.pki / "admin.crt", key_path=self.pki / "admin.key")
        if not self.cert_manager:
            # Berth's webhook and extender serve on loopback with a certificate of this CA
            # (with cert-manager, only the certificate it issues).
            tls.issue(
                ca, common_name="berth", dns_names=("localhost",), ip_addresses=("127.0.0.1",)
            ).write(cert_path=self.pki / "berth.crt", key_path=self.pki / "berth.key")
        self._write_webhook_client()
        private, public = tls.make_signing_key()
        (self.pki / "sa.key").write_bytes(private)
        (self.pki / "sa.pub").write_bytes(public)
        self._ca = ca
        self._admin = admin

    def _write_webhook_client(self) -> None:
        """The client certificate the API server presents to admission webhooks, from a
        CA of its own that signs nothing else (so no user's certificate passes Berth's
        webhook), and the admission configuration that makes the API server present it
        to every webhook it calls (kubeconfig user "*"). Berth's webhook requires it."""
        ca = tls.make_ca("berth-dev-webhook-client-ca")
        ca.write(cert_path=self.webhook_client_ca, key_path=self.pki / "webhook-client-ca.key")
        cert, key = self.webhook_client
        tls.issue(ca, common_name="kube-apiserver-webhook-client", client=True).write(
            cert_path=cert, key_path=key
        )
        kubeconfig = self.pki / "admission-kubeconfig.yaml"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "users": [
                        {
                            "name": "*",
                            "user": {"client-certificate": str(cert), "client-key": str(key)},
                        }
                    ],
                }
            )
        )
        plugins = [
            {
                "name": plugin,
                "configuration": {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "WebhookAdmissionConfiguration",
                    "kubeConfigFile": str(kubeconfig),
                },
            }
            for plugin in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
        ]
        (self.pki / "admission.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "AdmissionConfiguration",
                    "plugins": plugins,
                }
            )
        )

    @property
    def webhook_client_ca(self) -> Path:
        """The CA of the only client certificate Berth's webhook here accepts."""
        return self.pki / "webhook-client-ca.crt"

    @property
    def webhook_client(self) -> tuple[Path, Path]:
        """The certificate and key the API server presents to admission webhooks."""
        return self.pki / "apiserver-webhook-client.crt", self.pki / "apiserver-webhook-client.key"

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self._etcd_url = f"http://127.0.0.1:{client}"
        self._spawn(
            "etcd",
            [
                "etcd",
                "--name=berth-dev",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={self._etcd_url}",
                f"--advertise-client-urls={self._etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=berth-dev=http://127.0.0.1:{peer}",
                # A throwaway cluster: durability buys nothing and fsync costs seconds per test.
                "--unsafe-no-fsync",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
            port=client,
            health_url=f"{self._etcd_url}/health",
        )

    def _start_apiserver(self, *, profiling: bool) -> None:
        port = free_port()
        pki = self.pki
        self._spawn(
            "kube-apiserver",
            [
                "kube-apiserver",
                f"--etcd-servers={self._etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--admission-control-config-file={pki / 'admission.yaml'}",
                "--authorization-mode=Node,RBAC",
                # OwnerReferencesPermissionEnforcement, as some distributions enable it:
                # setting blockOwnerDeletion needs the owner's finalizers (see manifests/rbac).
                "--enable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
                "OwnerReferencesPermissionEnforcement",
                # TaintNodesByCondition taints every new node not-ready until the node
                # lifecycle controller sees it Ready and lifts the taint: two more requests
                # per node, and thousands of nodes wait on the controller-manager. `up`
                # waits until every node is Ready anyway, and a node that stops being Ready
                # later is still tainted by the node lifecycle controller.
                "--disable-admission-plugins=TaintNodesByCondition",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # No kubelets and a loopback address: the "kubernetes" Endpoints would be invalid.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                # A DeleteCollection (a namespace's cleanup, `kubectl delete pods --all`)
                # deletes its objects one at a time by default: 500 pods take 4 s here.
                f"--delete-collection-workers={DELETE_COLLECTION_WORKERS}",
                f"--profiling={str(profiling).lower()}",
                f"--cert-dir={pki}",
            ],
            port=port,
            health_url=f"https://127.0.0.1:{port}/readyz",
        )
        self._server = f"https://127.0.0.1:{port}"
        assert self._admin is not None
        self._write_kubeconfig(self.kubeconfig, self._admin)

    def _write_kubeconfig(self, path: Path, user: tls.KeyPair) -> None:
        """A kubeconfig at `path` for this API server, as the holder of `user`'s certificate."""
        assert self._ca is not None
        config = render.kubeconfig(
            server=self._server,
            ca_pem=self._ca.cert_pem,
            cert_pem=user.cert_pem,
            key_pem=user.key_pem,
        )
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(config))

    def _start_controller_manager(self) -> None:
        port = free_port()
        self._spawn(
            "kube-controller-manager",
            [
                "kube-controller-manager",
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.pki / 'controller-manager'}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={self.pki / 'ca.crt'}",
                f"--cluster-signing-key-file={self.pki / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--kube-api-qps={CLIENT_QPS}",
                f"--kube-api-burst={CLIENT_BURST}",
                f"--node-monitor-grace-period={NODE_LEASE_SECONDS}s",
                # The TTL controller re-annotates every node each time the node count
                # crosses a size class; kwok's nodes read no secrets or config maps.
                "--controllers=*,-ttl-controller",
            ],
            port=port,
            health_url=f"https://127.0.0.1:{port}/healthz",
        )

    def start_scheduler(
        self,
        *,
        name: str,
        scheduler_name: str | None = None,
        extenders: list[dict[str, Any]] | None = None,
        ignored_resources: list[str] | None = None,
    ) -> Component:
        """Start a kube-scheduler (more than one may run, each with its own profile names):
        one profile named `scheduler_name`, or else the profiles of Berth's default
        schedulerNames."""
        config = render.scheduler_config(
            kubeconfig_path=self.kubeconfig,
            scheduler_names=[scheduler_name] if scheduler_name else DEFAULT_SCHEDULER_NAMES,
            extenders=extenders,
            ignored_resources=ignored_resources,
            qps=CLIENT_QPS,
            burst=CLIENT_BURST,
        )
        return self.run_scheduler(name=name, config=config)

    def run_scheduler(self, *, name: str, config: dict[str, Any]) -> Component:
        """Start a kube-scheduler with this KubeSchedulerConfiguration (the bench tunes
        its client); `down` stops it with the rest."""
        port = free_port()
        config_path = self.state_dir / f"{name}.yaml"
        config_path.write_text(yaml.safe_dump(config))
        return self._spawn(
            name,
            [
                "kube-scheduler",
                f"--config={config_path}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.pki / name}",
            ],
            port=port,
            health_url=f"https://127.0.0.1:{port}/healthz",
        )

    def _start_kwok(self) -> None:
        """kwok under a name of its own, so that a policy can refuse its stale deletes."""
        assert self.binaries is not None
        assert self._ca is not None
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(render.kwok_delete_guard()))
        kwok_user = tls.issue(
            self._ca, common_name=render.KWOK_USER, organization="system:masters", client=True
        )
        self._write_kubeconfig(self.kwok_kubeconfig, kwok_user)
        port = free_port()
        stages = subprocess.run(
            [str(self.binaries.kwok), "stages"], check=True, capture_output=True, text=True
        ).stdout
        stages_path = self.state_dir / "kwok-stages.yaml"
        options = yaml.safe_dump(render.kwok_configuration(parallelism=KWOK_PARALLELISM))
        stages_path.write_text(f"{options}---\n{stages}")
        self._spawn(
            "kwok",
            [
                f"--config={stages_path}",
                f"--kubeconfig={self.kwok_kubeconfig}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={render.KWOK_NODE_ANNOTATION}=fake",
                "--manage-nodes-with-label-selector=",
                "--manage-single-node=",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.0.0.1",
                f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
                f"--server-address=127.0.0.1:{port}",
            ],
            port=port,
            health_url=f"http://127.0.0.1:{port}/healthz",
            command=[str(self.binaries.kwok)],
        )

    def _create_nodes(self, spec: ClusterSpec) -> None:
        manifests = [
            render.fake_node(
                name=f"node-{index}",
                cpu=spec.node_cpu,
                memory=spec.node_memory,
                pods=spec.node_pods,
            )
            for index in range(spec.nodes)
        ]
        if manifests:
            try:
                asyncio.run(
                    nodes.create_and_wait(
                        self.kubeconfig,
                        manifests,
                        timeout=nodes.wait_budget(spec.nodes),
                        report=self.report,
                    )
                )
            except ClusterError as error:
                raise ClusterError(f"{error} (logs in {self.logs})") from error
        # Pods cannot be created in a namespace before its default ServiceAccount exists.
        wait_until(
            lambda: (
                self.kubectl(
                    "get", "serviceaccount", "default", "-n", "default", check=False
                ).returncode
                == 0
            ),
            what="the default ServiceAccount",
        )

    def _start_cert_manager(self) -> None:
        """cert-manager's CRDs from its Go module, then its controllers and CA injector
        (one process, the cluster admin's credentials)."""
        crds = str(go_binaries.cert_manager_crds())
        self.kubectl("apply", "--server-side", "-f", crds)
        self.kubectl(
            "wait", "--for=condition=Established", "-f", crds, f"--timeout={START_TIMEOUT:.0f}s"
        )
        port = free_port()
        self._spawn(
            "cert-manager",
            [f"--kubeconfig={self.kubeconfig}", f"--health-port={port}"],
            port=port,
            health_url=f"http://127.0.0.1:{port}/healthz",
            command=[str(go_binaries.cert_manager())],
        )

    def _issue_serving_certificate(self) -> None:
        """Apply Berth's Issuers and Certificate (manifests/cert-manager, with the loopback
        names), wait until cert-manager made the Certificate Ready, and mount its Secret
        for the components to serve."""
        documents: list[dict[str, Any]] = []
        for path in sorted((REPO / "manifests" / "cert-manager").glob("*.yaml")):
            if path.name != "kustomization.yaml":
                documents += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        objects = [
            render.local_certificate(doc)
            if doc["kind"] == "Certificate" and doc["metadata"]["name"] == TLS_SECRET
            else doc
            for doc in documents
        ]
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
        wait_until(self._issued_by_the_ca, what="Berth's certificate, issued by the Berth CA")
        port = free_port()
        self._spawn(
            "berth-tls-mount",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--namespace={BERTH_NAMESPACE}",
                f"--name={TLS_SECRET}",
                f"--dir={self.tls_mount}",
                f"--health-port={port}",
            ],
            port=port,
            health_url=f"http://127.0.0.1:{port}/healthz",
            command=[sys.executable, "-m", "devtools.secretmount"],
        )

    def _issued_by_the_ca(self) -> bool:
        """Whether Berth's Certificate and the Berth CA's are Ready, neither being issued,
        and Berth's Secret carries the CA the CA's Secret holds. cert-manager at times
        issues the CA a second time a moment after the first (its caches a step behind),
        after it signed Berth's certificate with the first: the webhooks' caBundle would
        then name a CA the CA's Secret no longer holds. Berth's Certificate is then
        renewed (as `cmctl renew` does) and looked at again."""
        certificates = {
            name: self._certificate_conditions(name) for name in (CA_SECRET, TLS_SECRET)
        }
        if not all(
            c.get("Ready") == "True" and c.get("Issuing") != "True" for c in certificates.values()
        ):
            return False
        ca = self._secret_data(CA_SECRET).get("tls.crt")
        if ca is not None and ca == self._secret_data(TLS_SECRET).get("ca.crt"):
            return True
        self.report("cert-manager issued the Berth CA again: renewing Berth's certificate")
        self.renew_certificate(TLS_SECRET, "issued by a Berth CA that was issued again")
        return False

    def renew_certificate(self, name: str, why: str) -> None:
        """What `cmctl renew` does: the Certificate's Issuing condition set to True, for
        cert-manager to issue it again."""
        issuing = {
            "type": "Issuing",
            "status": "True",
            "reason": "ManuallyTriggered",
            "message": why,
            "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        self.kubectl(
            "patch",
            "certificate",
            name,
            f"--namespace={BERTH_NAMESPACE}",
            "--subresource=status",
            "--type=json",
            "--patch="
            + json.dumps([{"op": "add", "path": "/status/conditions/-", "value": issuing}]),
        )

    def _certificate_conditions(self, name: str) -> dict[str, str]:
        found = self.kubectl(
            "get", "certificate", name, f"--namespace={BERTH_NAMESPACE}", "-o", "json", check=False
        )
        if found.returncode != 0:
            return {}
        conditions = (json.loads(found.stdout).get("status") or {}).get("conditions") or []
        return {c.get("type"): c.get("status") for c in conditions}

    def _secret_data(self, name: str) -> dict[str, str]:
        found = self.kubectl(
            "get", "secret", name, f"--namespace={BERTH_NAMESPACE}", "-o", "json", check=False
        )
        return (json.loads(found.stdout).get("data") or {}) if found.returncode == 0 else {}

    @property
    def serving_files(self) -> tuple[Path, Path]:
        """The certificate and key Berth's components serve."""
        if self.cert_manager:
            return self.tls_mount / "tls.crt", self.tls_mount / "tls.key"
        return self.pki / "berth.crt", self.pki / "berth.key"

    def _serving_flags(self) -> list[str]:
        cert, key = self.serving_files
        return [f"--tls-cert-file={cert}", f"--tls-private-key-file={key}"]

    def _install_crds(self) -> None:
        """Berth's own API: the PodMigrationJob and Reservation CRDs from manifests/crds."""
        crds = REPO / "manifests" / "crds"
        self.kubectl("apply", "--server-side", "-k", str(crds))
        self.kubectl(
            "wait", "--for=condition=Established", "crd", "--all", f"--timeout={START_TIMEOUT:.0f}s"
        )

    def component_kubeconfig(self, component: str) -> Path:
        """The kubeconfig `berth <component>` runs with: its ServiceAccount's token."""
        return self.state_dir / f"{accounts.account(component)}.kubeconfig"

    def _credentials(self, component: str) -> Path:
        return accounts.write_kubeconfig(
            self.kubectl,
            admin=self.kubeconfig,
            component=component,
            path=self.component_kubeconfig(component),
        )

    def start_controller(self, *, name: str, config: Path | None = None) -> Component:
        """Run `berth controller` against this cluster (more than one may run: they elect)."""
        port = free_port()
        extra = [f"--config={config}"] if config else []
        return self._spawn(
            name,
            [
                "controller",
                f"--kubeconfig={self._credentials('controller')}",
                f"--lease-namespace={BERTH_NAMESPACE}",
                f"--health-port={port}",
                *self._serving_flags(),
                *extra,
            ],
            port=port,
            health_url=f"https://127.0.0.1:{port}/healthz",
            command=[sys.executable, "-m", "cli.berth"],
            verify_tls=True,
        )

    def _berth_component(self, name: str, args: list[str], *, port: int) -> Component:
        return self._spawn(
            name,
            [
                *args,
                f"--kubeconfig={self._credentials(args[0])}",
                "--host=127.0.0.1",
                f"--port={port}",
                *self._serving_flags(),
            ],
            port=port,
            health_url=f"https://127.0.0.1:{port}/healthz",
            command=[sys.executable, "-m", "cli.berth"],
            verify_tls=True,
        )

    def start_extender(self, *, name: str) -> Component:
        """Run `berth extender` over TLS on a free loopback port."""
        return self._berth_component(name, ["extender"], port=free_port())

    def start_webhook(self, *, name: str, config: Path | None = None) -> Component:
        """Run `berth webhook` over TLS on a free loopback port (with the controller's
        configuration file, when given), and point the API server's webhook
        configurations at it."""
        extra = [f"--config={config}"] if config else []
        # Only the API server may post reviews: each is taken at its word (its user, the
        # pod it names), and an eviction review makes Berth create a job.
        extra.append(f"--client-ca-file={self.webhook_client_ca}")
        webhook = self._berth_component(name, ["webhook", *extra], port=free_port())
        self.register_webhooks()
        return webhook

    def etcd_url(self) -> str:
        """The client URL of this cluster's etcd."""
        etcd = next(c for c in self.components if c.name == "etcd")
        return etcd.health_url.removesuffix("/health")

    def _berth_extenders(self, extender: Component) -> list[dict[str, Any]]:
        """The scheduler's extender entries for Berth, as the manifests of this cluster's
        scope recommend."""
        return render.berth_extenders(
            url=f"https://127.0.0.1:{extender.port}",
            ca_bundle=base64.b64encode(self.serving_ca.read_bytes()).decode(),
            scope=render.Scope(self.scope),
        )

    def register_webhooks(self) -> None:
        """Point both webhook configurations at every running webhook replica. With no
        Service to balance them here, each replica gets an entry of its own and every pod
        passes all of them in turn (the first claims; the others find the claim made).
        With cert-manager the caBundle is left to its CA injector, and this returns once
        it was injected into every entry."""
        ca = None if self.cert_manager else base64.b64encode(self.serving_ca.read_bytes()).decode()
        bases = [
            f"https://127.0.0.1:{c.port}"
            for c in self.running()
            if c.name.startswith("berth-webhook")
        ]
        urls = [f"{base}/mutate-pod" for base in bases]
        inject_ca_from = f"{BERTH_NAMESPACE}/{TLS_SECRET}" if self.cert_manager else None
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump(
                render.eviction_webhook_configuration(
                    urls=bases,
                    ca_bundle=ca,
                    skip_namespaces=["kube-system", BERTH_NAMESPACE],
                    inject_ca_from=inject_ca_from,
                )
            ),
        )
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump(
                render.webhook_configuration(
                    urls=urls,
                    ca_bundle=ca,
                    skip_namespaces=["kube-system", BERTH_NAMESPACE],
                    scope=render.Scope(self.scope),
                    inject_ca_from=inject_ca_from,
                )
            ),
        )
        if self.cert_manager:
            wait_until(self._ca_injected, what="cert-manager's CA injector to fill the caBundle")

    def _ca_injected(self) -> bool:
        """Whether every webhook configuration that asks for the CA of Berth's Certificate
        (the annotation, whichever configuration carries it) has it in every entry."""
        listed = yaml.safe_load(
            self.kubectl(
                "get",
                "mutatingwebhookconfigurations,validatingwebhookconfigurations",
                "-o",
                "yaml",
            ).stdout
        )
        wanted = f"{BERTH_NAMESPACE}/{TLS_SECRET}"
        ca = base64.b64encode(self.serving_ca.read_bytes()).decode()
        return all(
            hook["clientConfig"].get("caBundle") == ca
            for config in listed["items"]
            if (config["metadata"].get("annotations") or {}).get(render.INJECT_CA_FROM) == wanted
            for hook in config.get("webhooks") or []
        )

    # ----- use ------------------------------------------------------------------------

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run our kubectl against this cluster."""
        assert self.binaries is not None
        command = [str(self.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(command, input=input, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise ClusterError(f"`kubectl {' '.join(args)}` failed: {result.stderr.strip()}")
        return result
