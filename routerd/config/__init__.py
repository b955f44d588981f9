"""routerd.config."""
