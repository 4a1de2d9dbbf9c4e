"""The shared generator's data is a function of the test alone (tests/conftest.py reseeds it per test and per
fixture), so a test draws the same arrays alone, in the suite, and in any order."""

import numpy as np
import pytest
from model_builders import RNG, seed_of, x_data


def _expected(key: str, *shape) -> np.ndarray:
    return np.random.default_rng(seed_of(key)).standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def module_data():
    return x_data(5)


def test_seed_of_is_stable_across_processes():
    """sha256, not the salted str hash: this number is the same in every interpreter."""
    assert seed_of("tests/test_seeds.py::x") == 0xACF499F463ABD6B42E62487576EEC3C2


@pytest.mark.parametrize("case", ["a", "b"])
def test_a_tests_body_draws_from_its_node_id(request, case):
    first = x_data(3, 4)
    np.testing.assert_array_equal(first, _expected(request.node.nodeid, 3, 4))
    assert not np.array_equal(first, _expected(request.node.nodeid.replace(f"[{case}]", "[c]"), 3, 4))


def test_modules_that_imported_the_generator_draw_the_reseeded_stream(request):
    np.testing.assert_array_equal(RNG.standard_normal(6).astype(np.float32), _expected(request.node.nodeid, 6))


@pytest.mark.parametrize("case", ["a", "b"])
def test_a_module_fixture_draws_from_its_module_and_name(request, module_data, case):
    np.testing.assert_array_equal(module_data, _expected(f"{request.node.parent.nodeid}::module_data[0]", 5))
