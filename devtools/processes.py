"""The processes of a local control plane: start, probe, stop, and remember them.

Every component is a real process started from the cached binaries, on a free loopback
port, with its log under the state directory. `state.json` records what was started
(pid, port, command line) so `down` stops exactly those processes, another process (a
test, `berth dev status`) can look at them, and a second `up` can tell that a cluster
already runs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from devtools.binaries import Binaries

START_TIMEOUT = 90.0
STOP_TIMEOUT = 10.0


class ClusterError(RuntimeError):
    """The local control plane could not be started, or is in a state that forbids the step."""


@dataclass
class Component:
    """One process of the local control plane, as recorded in state.json."""

    name: str
    pid: int
    port: int
    health_url: str
    log: str
    verify_tls: bool = False
    """Whether its health endpoint serves a certificate of this cluster's CA."""


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "berth" / "dev"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) is not running.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z")


class Processes:
    """The processes started for the local cluster rooted at `state_dir`, and its layout."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = (state_dir or default_state_dir()).resolve()
        self.pki = self.state_dir / "pki"
        self.logs = self.state_dir / "logs"
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.kwok_kubeconfig = self.state_dir / "kwok.kubeconfig"
        self.state_file = self.state_dir / "state.json"
        self.components: list[Component] = []
        self.binaries: Binaries | None = None
        self.scope = "default"
        """Which pods reach Berth's extender and webhook (`devtools.render.Scope`)."""
        self.cert_manager = False
        """Whether cert-manager issues Berth's serving certificate (`up --cert-manager`)."""
        # Children started by this process, so they can be reaped rather than left as zombies.
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._load_state()

    # ----- state ----------------------------------------------------------------------

    def _load_state(self) -> None:
        if not self.state_file.exists():
            return
        state = json.loads(self.state_file.read_text())
        self.components = [Component(**item) for item in state["components"]]
        self.binaries = Binaries(Path(state["bin_dir"]))
        self.scope = str(state.get("scope", "default"))
        self.cert_manager = bool(state.get("cert_manager", False))

    def _save_state(self) -> None:
        assert self.binaries is not None
        state = {
            "bin_dir": str(self.binaries.bin_dir),
            "scope": self.scope,
            "cert_manager": self.cert_manager,
            "components": [asdict(component) for component in self.components],
        }
        self.state_file.write_text(json.dumps(state, indent=2))

    def owns(self, component: Component) -> bool:
        """True when the recorded pid is still the process we started (not a reused pid)."""
        if not pid_alive(component.pid):
            return False
        try:
            cmdline = Path(f"/proc/{component.pid}/cmdline").read_bytes()
        except OSError:
            return False
        return str(self.state_dir).encode() in cmdline

    @property
    def tls_mount(self) -> Path:
        """Where the `berth-tls` Secret cert-manager issued is mounted, as in a pod."""
        return self.state_dir / "mounts" / "berth-tls"

    @property
    def serving_ca(self) -> Path:
        """The CA of the certificate Berth's components serve: cert-manager's Berth CA
        from the mounted Secret, or else this cluster's own CA."""
        return self.tls_mount / "ca.crt" if self.cert_manager else self.pki / "ca.crt"

    def running(self) -> list[Component]:
        return [component for component in self.components if self.owns(component)]

    def _spawn(
        self,
        name: str,
        args: list[str],
        *,
        port: int,
        health_url: str,
        command: list[str] | None = None,
        verify_tls: bool = False,
    ) -> Component:
        """Start `kcp <args>` (or `command + args`) and wait until it is healthy."""
        assert self.binaries is not None
        log = self.logs / f"{name}.log"
        command = [*(command or [str(self.binaries.kcp)]), *args]
        env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        self._processes[process.pid] = process
        component = Component(
            name=name,
            pid=process.pid,
            port=port,
            health_url=health_url,
            log=str(log),
            verify_tls=verify_tls,
        )
        self.components.append(component)
        self._save_state()
        self._wait_healthy(component)
        return component

    def _wait_healthy(self, component: Component) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            if not pid_alive(component.pid):
                raise ClusterError(
                    f"{component.name} exited during start-up; "
                    f"last lines of {component.log}:\n{tail(component.log)}"
                )
            ok, last_error = self.probe(component)
            if ok:
                return
            time.sleep(0.2)
        raise ClusterError(
            f"{component.name} was not healthy after {START_TIMEOUT:.0f}s "
            f"({last_error}); last lines of {component.log}:\n"
            f"{tail(component.log)}"
        )

    def probe(self, component: Component) -> tuple[bool, str]:
        """One health request: (healthy, what was seen)."""
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        if component.verify_tls and self.serving_ca.exists():
            context.load_verify_locations(cafile=str(self.serving_ca))
        if component.name == "kube-apiserver":
            context.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        elif not component.verify_tls:
            # Scheduler and controller-manager serve a self-signed certificate of their own.
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(component.health_url, timeout=2, context=context) as r:
                body = r.read().decode(errors="replace")
                return r.status == 200, f"HTTP {r.status}: {body[:200]}"
        except urllib.error.HTTPError as error:
            return False, f"HTTP {error.code}"
        except (OSError, ssl.SSLError) as error:
            return False, str(error)

    def stop(self, component: Component) -> None:
        """Stop one component: SIGTERM, then SIGKILL if it lingers."""
        if self.owns(component):
            os.killpg(component.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT
            while self.owns(component) and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.owns(component):
                os.killpg(component.pid, signal.SIGKILL)
        process = self._processes.pop(component.pid, None)
        if process is not None:
            process.wait(timeout=STOP_TIMEOUT)
        self.components = [c for c in self.components if c.pid != component.pid]
        if self.binaries is not None:
            self._save_state()

    def command_line(self, component: Component) -> list[str]:
        """The running component's command line, which `respawn` starts again."""
        if not self.owns(component):
            raise ClusterError(f"{component.name} (pid {component.pid}) is not running")
        return Path(f"/proc/{component.pid}/cmdline").read_bytes().decode().split("\0")[:-1]

    def kill(self, component: Component) -> None:
        """SIGKILL the component's process group (nothing in flight gets to finish) and
        forget it."""
        if self.owns(component):
            os.killpg(component.pid, signal.SIGKILL)
        self.stop(component)

    def respawn(self, component: Component, argv: list[str]) -> Component:
        """Start a killed component again: the same command line, port and log, as a
        restarted container behind the same address. While it was down, another process
        on the machine may have taken its port for an outgoing connection: then it tries
        again until that connection is gone."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                return self._spawn(
                    component.name,
                    [],
                    port=component.port,
                    health_url=component.health_url,
                    command=argv,
                    verify_tls=component.verify_tls,
                )
            except ClusterError as error:
                if "address already in use" not in str(error) or time.monotonic() > deadline:
                    raise
                failed = [c for c in self.components if c.name == component.name]
                for attempt in failed:
                    self.stop(attempt)
                time.sleep(1)

    # ----- down and status ------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop the processes this cluster started, newest first; return their names."""
        stopped = []
        for component in reversed(list(self.components)):
            if self.owns(component):
                stopped.append(component.name)
            self.stop(component)
        self.state_file.unlink(missing_ok=True)
        return stopped

    def status(self) -> list[tuple[Component, bool, str]]:
        """Each recorded component with whether it runs and what its health check says."""
        report = []
        for component in self.components:
            if not self.owns(component):
                report.append((component, False, "not running"))
                continue
            healthy, seen = self.probe(component)
            report.append((component, healthy, seen))
        return report


def wait_until(
    predicate: Callable[[], bool],
    *,
    what: str,
    timeout: float = START_TIMEOUT,
    interval: float = 0.2,
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def tail(path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
