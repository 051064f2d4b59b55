"""Kubernetes access: the API client, informers, leader election and events."""
