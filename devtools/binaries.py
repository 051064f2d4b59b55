"""Build the control plane binaries once and cache them outside the work tree.

The cache key is a hash of everything that decides the binary (the Go module files,
the main package and the Go version), so a fresh clone on the same machine reuses
the binaries and a change of Kubernetes release builds anew.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tools"


class BuildError(RuntimeError):
    """The Go toolchain is missing or a build failed."""


@dataclass(frozen=True)
class Binaries:
    """Paths of the built binaries; `bin_dir` also holds a `kubectl` link to kcp."""

    bin_dir: Path

    @property
    def kcp(self) -> Path:
        return self.bin_dir / "kcp"

    @property
    def kwok(self) -> Path:
        return self.bin_dir / "kwok"

    @property
    def kubectl(self) -> Path:
        return self.bin_dir / "kubectl"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "berth" / "kcp"


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError("`go` is not on PATH: the local control plane is built from Go modules")
    return go


def _go_version(go: str) -> str:
    return subprocess.run(
        [go, "env", "GOVERSION"], check=True, capture_output=True, text=True
    ).stdout.strip()


def source_hash(go_version: str) -> str:
    """A short hash of the Go sources of tools/kcp and tools/kwok and the Go version."""
    digest = hashlib.sha256(go_version.encode())
    for module in ("kcp", "kwok"):
        for path in sorted((TOOLS / module).glob("*")):
            if path.suffix in {".go", ".mod", ".sum"}:
                digest.update(path.name.encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def kubernetes_version() -> str:
    """The Kubernetes release tools/kcp is built from, read from its go.mod."""
    match = re.search(
        r"^\s*k8s\.io/kubernetes (v\S+)", (TOOLS / "kcp" / "go.mod").read_text(), flags=re.M
    )
    if match is None:
        raise BuildError("tools/kcp/go.mod does not require k8s.io/kubernetes")
    return match.group(1)


def _version_flags() -> str:
    """Stamp the release into the binaries, as the Kubernetes release build does."""
    version = kubernetes_version()
    major, minor = version.lstrip("v").split(".")[:2]
    values = {"gitVersion": version, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean"}
    return " ".join(
        f"-X {package}.{key}={value}"
        for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for key, value in values.items()
    )


def _build(go: str, *, module: Path, package: str, output: Path, ldflags: str = "") -> None:
    env = {**os.environ, "GOTOOLCHAIN": "local"}
    # A name of this process's own: two processes building the same binary at once (an
    # e2e session and `make binaries`) must not rename each other's output away.
    partial = output.with_name(f"{output.name}.{os.getpid()}.partial")
    command = [go, "build", "-trimpath", f"-ldflags=-s -w {ldflags}", "-o", str(partial), package]
    started = time.monotonic()
    print(f"building {output.name} in {module} (first time only)...", file=sys.stderr, flush=True)
    result = subprocess.run(command, cwd=module, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"`{' '.join(command)}` failed in {module}:\n{result.stderr[-4000:]}")
    partial.rename(output)  # atomic: a half-written binary is never picked up
    print(f"built {output.name} in {time.monotonic() - started:.0f}s", file=sys.stderr)


def _module_hash(module: Path, go_version: str) -> str:
    digest = hashlib.sha256(go_version.encode())
    for path in sorted(module.glob("*")):
        if path.suffix in {".go", ".mod", ".sum"}:
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def tool_binary(name: str, *, package: str = ".", ldflags: str = "") -> Path:
    """Build (once) and return the Go tool of `tools/<name>`: its own module and cache.

    Tools beside the control plane (Helm, cert-manager, the descheduler) each have their
    own module, so a change to one never rebuilds the others or the control plane.
    """
    module = TOOLS / name
    if not (module / "go.mod").is_file():
        raise BuildError(f"{module} is missing its go.mod")
    go = _go()
    output = cache_root().parent / name / _module_hash(module, _go_version(go)) / name
    if not output.exists():
        output.parent.mkdir(parents=True, exist_ok=True)
        _build(go, module=module, package=package, output=output, ldflags=ldflags)
    return output


def module_dir(tool: str, module: str) -> Path:
    """The source of `module`, at the version `tools/<tool>` requires, in the Go module
    cache (downloaded if missing): where files a tool's module ships (CRDs, say) are read
    from at run time rather than copied into the repository."""
    env = {**os.environ, "GOTOOLCHAIN": "local"}
    command = [_go(), "mod", "download", "-json", module]
    result = subprocess.run(command, cwd=TOOLS / tool, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"`{' '.join(command)}` failed in tools/{tool}:\n{result.stderr[-2000:]}")
    return Path(json.loads(result.stdout)["Dir"])


CERT_MANAGER_MODULE = "github.com/cert-manager/cert-manager"


def cert_manager() -> Path:
    """cert-manager's controllers and CA injector, built from its Go module (tools/certmanager)."""
    return tool_binary("certmanager")


def cert_manager_crds() -> Path:
    """cert-manager's CRDs, from the module tools/certmanager is built from."""
    return module_dir("certmanager", CERT_MANAGER_MODULE) / "deploy" / "crds"


def ensure_binaries() -> Binaries:
    """Return the cached binaries, building any that are missing."""
    if not (TOOLS / "kcp" / "go.mod").is_file():
        raise BuildError(f"{TOOLS / 'kcp'} is missing: the local control plane needs a checkout")
    go = _go()
    binaries = Binaries(cache_root() / source_hash(_go_version(go)))
    binaries.bin_dir.mkdir(parents=True, exist_ok=True)
    if not binaries.kcp.exists():
        _build(go, module=TOOLS / "kcp", package=".", output=binaries.kcp, ldflags=_version_flags())
    if not binaries.kwok.exists():
        _build(go, module=TOOLS / "kwok", package=".", output=binaries.kwok)
    if not binaries.kubectl.exists():
        binaries.kubectl.symlink_to("kcp")
    return binaries
