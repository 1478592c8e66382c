"""Adapter sync: where published adapters live, and when the replicas can see them (sync.kind)."""

from agrpo.sync.base import AdapterStore, get_store

__all__ = ["AdapterStore", "get_store"]
