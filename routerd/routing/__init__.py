"""routerd.routing."""
