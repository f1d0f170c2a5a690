"""monel.tensorflow: collectives on tf.Tensors, eagerly and in tf.function, variables and
the distributed tape; errors; and data-parallel training equal to one process."""

import pytest
from common import WORKERS, assert_same_training, train
from conftest import assert_ok, results, run_ranks


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_eager_and_in_tf_function(n):
    res = results(assert_ok(run_ranks("tf_collectives", n, 120, script=WORKERS)))
    assert all(r["checks"] >= 60 for r in res), res


def test_bad_input_is_a_typed_error_and_the_job_goes_on():
    res = results(assert_ok(run_ranks("tf_errors", 2, 120, script=WORKERS)))
    assert all(len(r["errors"]) == 6 for r in res), res


def test_dead_peer_is_named():
    outs = run_ranks("tf_dead_peer", 3, 120, env={"MONEL_TIMEOUT": "10"}, script=WORKERS)
    assert outs[2][0] == 0
    for r in results(assert_ok(outs[:2])):
        assert r["monel"] and 2 in r["ranks"] and r["seconds"] < 15, r


@pytest.mark.parametrize("n", [2, 4])
def test_tensorflow_training_matches_one_process(tmp_path, n):
    assert_same_training(train(tmp_path, "tf_train.py", 1), train(tmp_path, "tf_train.py", n),
                         n)

