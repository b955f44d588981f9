"""routerd.catalog."""
