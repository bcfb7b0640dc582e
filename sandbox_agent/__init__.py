"""The in-sandbox tool agent: an HTTP server on a Unix socket that runs file and
shell tools for one user, with every path resolved by the PathSandbox.

Nothing here imports `orchestrator`: the dependency direction is orchestrator → sandbox_agent.
"""
