from tests.agent_env import agent_client, agent_data_dir, agent_service, traversable_tmp  # noqa: F401 - fixtures
