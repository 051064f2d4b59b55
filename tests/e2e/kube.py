"""The handle e2e tests get: kubectl, the kubeconfig, and waits on conditions."""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.cluster import LocalCluster

DEFAULT_TIMEOUT = 60.0


class WaitTimeout(AssertionError):
    pass


@dataclass
class Cluster:
    local: LocalCluster
    up_output: str

    @property
    def kubeconfig(self) -> Path:
        return self.local.kubeconfig

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = self.local.kubectl(*args, input=input, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
        return result

    def get(self, *args: str) -> dict[str, Any]:
        """`kubectl get ... -o json`, parsed."""
        data: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return data

    def apply(self, manifest: str, namespace: str | None = None) -> None:
        extra = ["-n", namespace] if namespace else []
        self.kubectl("apply", *extra, "-f", "-", input=manifest)

    def wait(
        self, predicate: Callable[[], Any], *, what: str, timeout: float = DEFAULT_TIMEOUT
    ) -> Any:
        """Poll a synchronous predicate until it returns something truthy."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.2)

    async def akubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """kubectl from async code: in a thread, so servers on the loop keep answering."""
        return await asyncio.to_thread(self.kubectl, *args, input=input, check=check)

    async def aget(self, *args: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.get, *args)

    async def aapply(self, manifest: str, namespace: str | None = None) -> None:
        await asyncio.to_thread(self.apply, manifest, namespace)

    async def await_(
        self,
        predicate: Callable[[], Any | Awaitable[Any]],
        *,
        what: str,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Any:
        """Poll a predicate from async code; a plain function runs in a thread so that
        servers on the event loop (a test's extender or webhook) keep answering."""
        deadline = time.monotonic() + timeout
        while True:
            if inspect.iscoroutinefunction(predicate):
                value = await predicate()
            else:
                value = await asyncio.to_thread(predicate)
            if value:
                return value
            if time.monotonic() > deadline:
                raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}")
            await asyncio.sleep(0.2)


def pods(cluster: Cluster, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    args = ["pods", "-n", namespace] + (["-l", selector] if selector else [])
    items: list[dict[str, Any]] = cluster.get(*args)["items"]
    return items


def refusing_policy(
    name: str,
    *,
    rule: dict[str, Any],
    condition: str,
    message: str,
    namespace: str | None = None,
) -> str:
    """A ValidatingAdmissionPolicy named `name`, and its binding, that refuse with
    `message` every CREATE of the resources `rule` names (apiGroups, apiVersions,
    resources) for which the CEL `condition` holds; in `namespace` only, when given."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{**rule, "operations": ["CREATE"]}]},
            "matchConditions": [{"name": "refused", "expression": condition}],
            "validations": [{"expression": "false", "message": message}],
        },
    }
    binding: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    if namespace is not None:
        binding["spec"]["matchResources"] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        }
    return "\n---\n".join(json.dumps(doc) for doc in (policy, binding))
