"""Berth: safe pod migration for Kubernetes. Reserve a place for the pod first, then move it."""

__version__ = "0.1.0"
