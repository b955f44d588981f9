"""Fixtures of the real-backend tier (see :mod:`tests.integration.real_backends`), for its integration and
browser tests."""

from __future__ import annotations

import pytest

from tests.integration.real_backends import RealServers, TinyModels, real_servers_or_skip, tiny_models_in


@pytest.fixture(scope="session")
def real_servers() -> RealServers:
    """The installed llama-server and whisper-server (skips, or fails when required, if missing)."""
    return real_servers_or_skip()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """Every generated model, written once per test session."""
    return tiny_models_in(tmp_path_factory.mktemp("tiny-models"))
