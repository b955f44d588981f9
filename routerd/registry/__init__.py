"""routerd.registry."""
