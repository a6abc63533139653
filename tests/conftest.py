import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture
def shared_data():
    """../shared/data, or skip: the default suite must pass without it."""
    data = SHARED / "data"
    if not data.is_dir():
        pytest.skip("../shared/data is not present (opt-in test)")
    return data


@pytest.fixture(autouse=True)
def _seeded():
    """Random-init weights and sample crops are the same on every run."""
    import keras

    keras.utils.set_random_seed(0)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A tiny image folder of crops of two sample photos (tests.helpers.photo_folder)."""
    from tests.helpers import photo_folder

    return photo_folder(tmp_path_factory.mktemp("photos"))
