"""Placeholder; replaced by the security report generator."""
