"""Reading the deployable manifests under manifests/ as kustomize lists them."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml

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


PORTS = {"controller": (8080, "HTTPS"), "webhook": (9443, "HTTPS"), "extender": (8443, "HTTPS")}


def deployment(component: str) -> Object:
    return one(objects(MANIFESTS / component), "Deployment", f"berth-{component}")


def the_container(component: str) -> Object:
    containers: list[Object] = deployment(component)["spec"]["template"]["spec"]["containers"]
    [container] = containers
    return container


def container_port(container: Object, port: int | str) -> int:
    if isinstance(port, int):
        return port
    [number] = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    assert isinstance(number, int)
    return number
