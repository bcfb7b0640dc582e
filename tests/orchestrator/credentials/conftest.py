from tests.orchestrator.sandboxes.docker.conftest import sandbox_image  # noqa: F401 - the session's image fixture
