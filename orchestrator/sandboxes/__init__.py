"""Where and how a user's sandbox runs: the router, the backend interface and its backends
(docker, process, bwrap), the agent's launch and deployment, the backend choice, the sandbox
uid block, and the sandbox image build (`image/`)."""
