"""routerd.store."""
