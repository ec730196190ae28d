"""Package layout: `domains/`, `adapters/` and `sandboxes/` install inside the `pivot_envs` namespace.

The folders stay top-level (see docs), but their import names are `pivot_envs.domains`,
`pivot_envs.adapters` and `pivot_envs.sandboxes`, so nothing is importable as a bare `domains`,
`adapters` or `sandboxes`.
"""

from setuptools import find_packages, setup

MAPPED = {"pivot_envs.domains": "domains", "pivot_envs.adapters": "adapters", "pivot_envs.sandboxes": "sandboxes"}

packages = find_packages(include=["pivot_envs", "pivot_envs.*"])
for namespace, folder in MAPPED.items():
    packages += [namespace + name[len(folder) :] for name in find_packages(include=[folder, folder + ".*"])]

setup(packages=packages, package_dir={"pivot_envs": "pivot_envs", **MAPPED})
