"""The shared backend conformance suite for the posix and memory backends."""

from __future__ import annotations

import uuid

import pytest
from helpers import read_file

from collio.backends import memory
from collio.testing.target_suites import ByteBackendTests


class TestPosix(ByteBackendTests):
    backend = "posix"

    @pytest.fixture
    def target(self, mpi_tmp_path):
        return str(mpi_tmp_path / "conformance.bin")

    def stored(self, target, open_options):
        return read_file(target)


class TestPosixNoWriteback(TestPosix):
    @pytest.fixture
    def open_options(self):
        return {"writeback": False}


class TestMemory(ByteBackendTests):
    backend = "memory"

    @pytest.fixture
    def target(self, comm):
        name = "mem://" + comm.bcast(uuid.uuid4().hex if comm.rank == 0 else None, root=0)
        yield name
        if comm.rank == 0:
            memory.drop(name)

    def stored(self, target, open_options):
        try:
            return memory.contents(target)
        except KeyError:
            return None
