"""routerd.sim."""
