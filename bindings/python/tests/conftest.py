"""Fixtures of the binding's tests: the store under test comes from the
environment, as for the C conformance suite (tests/stores/CMakeLists.txt):
DLOCK_TEST_URI, or the first line of the file DLOCK_TEST_URI_FILE (written by
the server fixture), with DLOCK_TEST_URI_SUFFIX appended. Without either,
a SQLite file in a temporary folder."""
import os
import uuid

import pytest

import dlock


def _uri(tmp_path_factory):
    uri = os.environ.get("DLOCK_TEST_URI")
    if not uri:
        path = os.environ.get("DLOCK_TEST_URI_FILE")
        if path:
            with open(path) as f:
                uri = f.readline().strip()
        else:
            uri = "sqlite://" + str(tmp_path_factory.mktemp("dlock") / "test.db")
    return uri + os.environ.get("DLOCK_TEST_URI_SUFFIX", "")


@pytest.fixture(scope="session")
def uri(tmp_path_factory):
    return _uri(tmp_path_factory)


@pytest.fixture
def store(uri):
    with dlock.Store(uri) as s:
        yield s


@pytest.fixture
def other_store(uri):
    """A second store handle: another owner, as another process would be."""
    with dlock.Store(uri) as s:
        yield s


@pytest.fixture
def name(request):
    """A lock name no other test (or earlier run) uses."""
    return "pytest/%s/%s" % (request.node.name, uuid.uuid4().hex[:12])
