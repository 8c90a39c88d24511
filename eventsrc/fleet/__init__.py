"""The fleet's side: the sink from NATS JetStream into PostgreSQL (docs/fleet.md)."""
