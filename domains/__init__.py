"""Bundled domains (installed as `pivot_envs.domains`); each folder is one domain plugin."""
