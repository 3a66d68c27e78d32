"""The kernel↔browser contract: trait names, packed tables, the protocol version, the model."""
