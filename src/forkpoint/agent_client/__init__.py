"""agent_client."""
