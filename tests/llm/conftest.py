"""The files here start vLLM's CPU engine inside a real tritonserver (most of them): each file holds the
session's engine lock while it runs (tests/conftest.py's `one_vllm_engine_file_at_a_time`), so that two
engines never share the two cores with the rest of the suite."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def engine_files_take_turns(one_vllm_engine_file_at_a_time):
    yield
