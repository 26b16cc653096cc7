"""The shared backend conformance suite, at many ranks."""

from __future__ import annotations

import os
import uuid

import pytest

from collio.testing.backend_suite import BackendTests


@pytest.mark.mpi
class TestPosix(BackendTests):
    backend = "posix"

    @pytest.fixture
    def target(self, shared_dir):
        return os.path.join(shared_dir, "conformance.bin")


@pytest.mark.mpi
class TestPosixNoWriteback(TestPosix):
    @pytest.fixture
    def open_options(self):
        return {"writeback": False}


@pytest.mark.mpi
class TestMemory(BackendTests):
    backend = "memory"

    @pytest.fixture
    def target(self, comm):
        return "mem://" + comm.bcast(uuid.uuid4().hex if comm.rank == 0 else None, root=0)
