"""routerd: a Twisted cluster router for local AI inference backends."""

__version__ = "0.1.0"
