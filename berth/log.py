"""Logging set-up shared by the three components, so their logs read alike."""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup() -> None:
    logging.basicConfig(level=logging.INFO, format=FORMAT)
