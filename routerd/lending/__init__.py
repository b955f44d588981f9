"""routerd.lending."""
