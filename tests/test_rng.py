"""Every random generator's state survives a checkpoint: the draws after a restore are the draws after capture."""
import io
import random
import zipfile

import numpy as np
import torch

from torchstage.files.checkpoint_file import serialize
from torchstage.rng import get_rng_state, set_rng_state


def _draws() -> tuple:
    return random.random(), np.random.rand(), np.random.randn(), torch.rand(3).tolist(), np.random.randn()


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _advance() -> None:
    _seed(3)
    _draws()
    np.random.randn()  # a third normal draw: numpy now holds the cached second half of a pair


def test_a_state_through_a_checkpoint_file_gives_the_same_draws():
    _advance()
    state = get_rng_state()
    expected = _draws()
    _seed(0)
    loaded = torch.load(io.BytesIO(serialize({"rng": state})), weights_only=True)["rng"]
    set_rng_state(loaded)
    assert _draws() == expected


def test_each_generator_is_one_plain_value_in_the_checkpoint():
    """Not tensors: each would cost torch.save a record and some twenty pickled objects per checkpoint."""
    state = get_rng_state()
    assert not any(isinstance(v, torch.Tensor) for v in (state["python"]["state"], state["numpy"]["keys"],
                                                         state["torch"]))
    archive = io.BytesIO(serialize({"rng": state}))
    assert not [name for name in zipfile.ZipFile(archive).namelist() if "/data/" in name]  # no tensor records


def test_a_state_saved_as_tensors_by_an_earlier_version_still_restores():
    _advance()
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    old = {"python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
           "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                     "has_gauss": int(has_gauss), "cached": float(cached)},
           "torch": torch.get_rng_state()}
    expected = _draws()
    _seed(0)
    set_rng_state(old)
    assert _draws() == expected


def test_seeded_draws_alike_and_leaves_every_generator_as_it_was():
    import random

    import numpy as np

    from torchstage.rng import seeded
    torch.manual_seed(3)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    with seeded(11):
        first = (random.random(), np.random.rand(), torch.rand(2))
    with seeded(11):
        again = (random.random(), np.random.rand(), torch.rand(2))
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])
    after = (random.getstate(), np.random.get_state()[1], torch.get_rng_state())
    assert before[0] == after[0] and (before[1] == after[1]).all() and torch.equal(before[2], after[2])
