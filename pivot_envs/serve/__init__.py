"""Pivot envs over HTTP: `pivotrl serve` hosts a registered pivot env behind the library's own
session protocol (`/v1/...`) and NeMo-Gym's resource-server protocol (`/seed_session`,
`/verify`); see docs/serve.md.

Nothing here is imported by `import pivot_envs`, and this package's own `import` loads no web
framework: the server modules import FastAPI and uvicorn, and only the command that runs them
(or a caller that builds an app) imports those modules.
"""
