"""Adapters for external task formats (Harbor)."""
