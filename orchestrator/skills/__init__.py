"""Skills as runs and admins see them: the run-facing skill service, the port runs depend on,
and managing skill sources through the API."""
