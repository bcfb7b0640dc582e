"""Bytes leaving the service: the outbox of outgoing deliveries, public uploads, the host's URL
fetch and image sniffing."""
