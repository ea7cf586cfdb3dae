"""The `sandbox` fixture: a test that takes it runs once behind bubblewrap (skipped, with the
reason, where this machine cannot start it) and once behind the guard alone."""

import pytest

from lmforge.eval.sandbox import bwrap_unavailable


@pytest.fixture(params=["bwrap", "guard"])
def sandbox(request) -> str:
    if request.param == "bwrap" and (reason := bwrap_unavailable()):
        pytest.skip(reason)
    return request.param
