"""routerd.defaults."""
