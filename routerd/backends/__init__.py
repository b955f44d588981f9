"""routerd.backends."""
