"""monel.keras: model.fit data-parallel on Keras 3's TensorFlow and JAX back ends, equal to
one process."""

import pytest
from common import assert_same_training, train


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
@pytest.mark.parametrize("n", [2, 4])
def test_keras_fit_matches_one_process(tmp_path, backend, n):
    args = ["--keras-backend", backend]
    assert_same_training(
        train(tmp_path, "keras_train.py", 1, args), train(tmp_path, "keras_train.py", n, args), n
    )
