"""Pharos."""
