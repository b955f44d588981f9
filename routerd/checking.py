"""``--check``: everything a node would refuse at start, found before it starts.

The YAML is validated by :func:`routerd.config.load.load_config`; then every ``.kcpps`` of
``models.config_dir`` is parsed and validated, and every backend binary the configured mode needs is
looked up.  Each problem is one line naming the file or key, so an operator fixes them all at once.
"""

from __future__ import annotations

from routerd.catalog.catalog import Catalog, CatalogError
from routerd.config.load import ConfigError, load_config


def check_config(path: str | None) -> tuple[bool, list[str]]:
    """``(ok, errors)`` for the config at ``path`` (the embedded default when ``None``)."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        return False, list(exc.errors)
    errors: list[str] = []
    try:
        Catalog.scan(config.models.config_dir, config.backend.mode)
    except CatalogError as exc:
        errors.append(f"models.config_dir: {exc}")
    return not errors, errors
