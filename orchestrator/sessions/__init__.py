"""Sessions: their records, repository and service, cleanup and storage upkeep, the chat store
and its records, the transcript view, the cross-session gate and project settings."""
