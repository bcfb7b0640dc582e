"""The HTTP API: routes, bodies, auth and the request guard."""
