"""The shared backend conformance suite, on one rank (no mpiexec)."""

from __future__ import annotations

import uuid

import pytest

from collio.testing.backend_suite import BackendTests


class TestPosix(BackendTests):
    backend = "posix"

    @pytest.fixture
    def target(self, tmp_path):
        return str(tmp_path / "conformance.bin")


class TestMemory(BackendTests):
    backend = "memory"

    @pytest.fixture
    def target(self):
        return "mem://" + uuid.uuid4().hex
