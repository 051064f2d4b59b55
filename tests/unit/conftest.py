"""Fixtures shared by unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from berth.kube.client import Kube
from devtools.processes import free_port
from webhook.app import Webhook


@pytest.fixture
async def webhook() -> AsyncIterator[Webhook]:
    """A webhook whose API server is a closed port: any call it makes fails."""
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"
    kube = Kube(client.ApiClient(configuration))
    yield Webhook(kube)
    await kube.close()
