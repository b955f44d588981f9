"""The node's local model catalog: every ``.kcpps`` model config in ``models.config_dir`` parsed
into a ``ModelConfig`` (kind, capabilities, weight files), weight and config hashing with its
cache, text-lending eligibility, and the problems ``routerd check`` reports for one config."""
