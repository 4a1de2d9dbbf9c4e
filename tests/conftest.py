"""Shared test set-up: this folder is on sys.path, so tests import model_builders (small ONNX models built
the way exporters write them) wherever they live.

Random data: tests draw from ``model_builders.RNG``, reseeded here before each fixture's set-up (key: the node
the fixture is cached on, its name and parameter index) and before each test's body (key: the test's node id).
A test's data therefore does not depend on which tests ran before it, nor on running it alone or in the suite."""

import pytest

import model_builders


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    model_builders.reseed(f"{request.node.nodeid}::{fixturedef.argname}[{getattr(request, 'param_index', 0)}]")
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    model_builders.reseed(item.nodeid)
    yield
