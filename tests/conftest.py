"""Shared fixtures: a fresh workspace per test, small models with seeded weights."""

from __future__ import annotations

import pytest


@pytest.fixture
def ws(tmp_path):
    import workbench as wb

    return wb.Workspace(tmp_path / "ws")


@pytest.fixture(scope="session")
def sr_model():
    import workbench as wb

    return wb.default_model()
