"""The node's configuration: the attrs schema of every section, YAML loading and validation (a bad
value is a ``ConfigError`` naming its path), durations, named inference keys, and the lending
settings with their defaults, bounds and normalisation (shared by the config file, the stored
overrides and the settings API)."""
