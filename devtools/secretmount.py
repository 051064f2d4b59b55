"""A Secret mounted as files, for components that run as local processes rather than pods.

In a cluster the kubelet mounts the `berth-tls` Secret into the webhook and extender pods
and, when cert-manager renews the certificate, updates the files in place. Here that is
this process: it reads the Secret once a second and, when its data changed, writes it the
way the kubelet's AtomicWriter does, so a reader never sees a new certificate beside an
old key:

    <dir>/..2026_11_23_15_04_05.123456789/tls.crt    the files of one version
    <dir>/..data -> ..2026_11_23_15_04_05.123456789  swapped with one rename
    <dir>/tls.crt -> ..data/tls.crt                  what components are given

Run as `python -m devtools.secretmount --kubeconfig K --namespace NS --name N --dir D
--health-port P`; `/healthz` answers once the files were written a first time.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import os
import shutil
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from berth.kube.client import SECRETS, Kube, KubeError

log = logging.getLogger("secretmount")

DATA = "..data"
POLL_INTERVAL = 1.0


def write_atomically(directory: Path, files: dict[str, bytes]) -> None:
    """Make `directory` hold exactly `files` in one step: a new timestamped directory,
    then a rename of the `..data` symlink onto it; the visible names are symlinks through
    `..data`, made once. The previous version's directory is removed afterwards."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    version = directory / stamp
    version.mkdir(mode=0o700)
    for name, content in files.items():
        path = version / name
        path.write_bytes(content)
        path.chmod(0o600)
    data = directory / DATA
    previous = os.readlink(data) if data.is_symlink() else None
    staged = directory / f"{DATA}_tmp"
    staged.unlink(missing_ok=True)
    staged.symlink_to(stamp)
    staged.rename(data)  # atomic: readers see the old version or the new, never a mix
    for name in files:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(Path(DATA) / name)
    for entry in directory.iterdir():
        if entry.is_symlink() and entry.name not in files and entry.name != DATA:
            entry.unlink()  # a key the Secret no longer has
    if previous is not None and previous != stamp:
        shutil.rmtree(directory / previous, ignore_errors=True)


def secret_files(secret: Mapping[str, Any]) -> dict[str, bytes]:
    """The files a volume of this Secret shows: one per key of its data, decoded."""
    data: Mapping[str, str] = secret.get("data") or {}
    return {key: base64.b64decode(value) for key, value in data.items()}


async def mirror(
    kube: Kube, *, namespace: str, name: str, directory: Path, ready: asyncio.Event
) -> None:
    """Keep `directory` equal to the Secret's data, until cancelled."""
    written: dict[str, bytes] | None = None
    while True:
        try:
            files = secret_files(await kube.get(SECRETS, name, namespace))
        except KubeError as error:
            if not error.not_found:
                log.warning("reading Secret %s/%s: %s", namespace, name, error)
            files = None
        if files is not None and files != written:
            write_atomically(directory, files)
            written = files
            log.info(
                "Secret %s/%s written to %s (%s)", namespace, name, directory, ", ".join(files)
            )
            ready.set()
        await asyncio.sleep(POLL_INTERVAL)


async def main(args: argparse.Namespace) -> None:
    ready = asyncio.Event()

    async def healthz(_: web.Request) -> web.Response:
        if ready.is_set():
            return web.Response(text="ok")
        return web.Response(status=503, text="the Secret was not written yet")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.health_port).start()
    kube = await Kube.connect(args.kubeconfig)
    try:
        await mirror(
            kube, namespace=args.namespace, name=args.name, directory=args.dir, ready=ready
        )
    finally:
        await kube.close()
        await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="secretmount", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--health-port", type=int, required=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(main(parser.parse_args()))
