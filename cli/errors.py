"""What the commands say of the API server's refusals, and which are worth a retry."""

from __future__ import annotations

import aiohttp

from berth.kube.client import KubeError


def transient(error: BaseException) -> bool:
    """An error whose request may go through if sent again."""
    if isinstance(error, KubeError):
        return error.status == 429 or error.status >= 500
    return isinstance(error, aiohttp.ClientError | TimeoutError)


def said(error: BaseException) -> str:
    if isinstance(error, KubeError):
        return f"HTTP {error.status}: {error.message}"
    return str(error) or type(error).__name__


def api_problem(error: KubeError | aiohttp.ClientError | TimeoutError) -> str:
    """What went wrong with the API server, in one line."""
    if isinstance(error, KubeError):
        return error.message
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        return f"the API server's certificate does not verify: {error}"
    return f"the API server cannot be reached: {said(error)}"
