"""monel.jax: collectives on jax arrays and pytrees, eagerly and inside jit; errors; and
data-parallel training equal to one process."""

import pytest
from common import assert_same_training, collectives, dead_peer, errors, train


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_eager_and_jitted(n):
    collectives("jax_collectives", n, at_least=60)


def test_bad_input_is_a_typed_error_and_the_job_goes_on():
    errors("jax_errors", 6)


def test_dead_peer_is_named():
    dead_peer("jax_dead_peer")


@pytest.mark.parametrize("n", [2, 4])
def test_jax_training_matches_one_process(tmp_path, n):
    assert_same_training(train(tmp_path, "jax_train.py", 1), train(tmp_path, "jax_train.py", n), n)
