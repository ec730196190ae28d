"""Sandboxes shared by the sandboxed domains (terminal, SWE)."""
