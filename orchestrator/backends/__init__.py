"""Where sandboxes run: the ContainerBackend interface and its implementations."""
