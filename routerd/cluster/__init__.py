"""routerd.cluster."""
