"""routerd.api."""
