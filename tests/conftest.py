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


@pytest.fixture
def fresh_worker(monkeypatch):
    """A crash-isolating worker of this test's own (runners made in the test use it),
    closed afterwards."""
    from workbench.runtime import worker as worker_mod

    w = worker_mod.Worker()
    monkeypatch.setattr(worker_mod, "_WORKER", w)
    yield w
    w.close()


@pytest.fixture
def one_torch_thread():
    """torch on one intra-op thread for the test (the noise-floor tests measure rounding
    against what one thread's summation order gives), put back afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
