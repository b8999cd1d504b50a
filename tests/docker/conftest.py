"""The parsed docker-compose.yml, one fixture for the compose and image tests."""

from __future__ import annotations

import pytest

from tests.docker.compose_support import COMPOSE_FILE


@pytest.fixture(scope="module")
def compose() -> dict:
    """docker-compose.yml as a dict (skips without pyyaml)."""
    yaml = pytest.importorskip(
        "yaml", reason="pyyaml is not installed (it is in the dev extra: pip install -e '.[dev]')"
    )
    return yaml.safe_load(COMPOSE_FILE.read_text())
