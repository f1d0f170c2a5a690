"""monel.mxnet: collectives on NDArrays, new and in place; errors; and
data-parallel training equal to one process."""

import pytest
from common import WORKERS, assert_same_training, train
from conftest import assert_ok, results, run_ranks


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_new_and_in_place(n):
    res = results(assert_ok(run_ranks("mxnet_collectives", n, 120, script=WORKERS)))
    assert all(r["checks"] >= 30 for r in res), res


def test_bad_input_is_a_typed_error_and_the_job_goes_on():
    res = results(assert_ok(run_ranks("mxnet_errors", 2, 120, script=WORKERS)))
    assert all(len(r["errors"]) == 5 for r in res), res


def test_dead_peer_is_named():
    outs = run_ranks("mxnet_dead_peer", 3, 120, env={"MONEL_TIMEOUT": "10"}, script=WORKERS)
    assert outs[2][0] == 0
    for r in results(assert_ok(outs[:2])):
        assert r["monel"] and 2 in r["ranks"] and r["seconds"] < 15, r


@pytest.mark.parametrize("n", [2, 4])
def test_mxnet_gluon_training_matches_one_process(tmp_path, n):
    assert_same_training(train(tmp_path, "mxnet_train.py", 1), train(tmp_path, "mxnet_train.py", n),
                         n)

