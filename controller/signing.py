"""The admission key: the random key the admission marks are signed with
(`controller.jobs.marker`), kept in a Secret in the controller's namespace.

Created by the first replica that starts; a second replica that races it loses the
create (409) and reads the winner's key, so every replica signs with the same key and a
new leader honours the marks of the old one.
"""

from __future__ import annotations

import base64
import secrets

from berth.kube.client import SECRETS, Kube, KubeError, Object

SECRET = "berth-admission-key"
FIELD = "key"
KEY_BYTES = 32


async def admission_key(kube: Kube, *, namespace: str) -> bytes:
    """The key in Secret `berth-admission-key`, created with a fresh key if missing."""
    body: Object = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": namespace},
        "type": "Opaque",
        "data": {FIELD: base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()},
    }
    try:
        secret = await kube.create(SECRETS, body, namespace=namespace)
    except KubeError as error:
        if not error.conflict:
            raise
        secret = await kube.get(SECRETS, SECRET, namespace=namespace)
    key = base64.b64decode((secret.get("data") or {}).get(FIELD) or "")
    if len(key) < KEY_BYTES:
        raise SystemExit(f"Secret {namespace}/{SECRET} holds no usable {FIELD!r}")
    return key
