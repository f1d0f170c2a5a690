"""monel.mxnet: collectives on NDArrays, new and in place; errors; and
data-parallel training equal to one process."""

import pytest
from common import assert_same_training, collectives, dead_peer, errors, train


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_new_and_in_place(n):
    collectives("mxnet_collectives", n, at_least=30)


def test_bad_input_is_a_typed_error_and_the_job_goes_on():
    errors("mxnet_errors", 5)


def test_dead_peer_is_named():
    dead_peer("mxnet_dead_peer")


@pytest.mark.parametrize("n", [2, 4])
def test_mxnet_gluon_training_matches_one_process(tmp_path, n):
    ref = train(tmp_path, "mxnet_train.py", 1)
    assert_same_training(ref, train(tmp_path, "mxnet_train.py", n), n)
