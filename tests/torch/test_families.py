"""Every family on the torch backend: HF's own classes from the core's parameters, fed as each family wants."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import backend
from hf_families import FAMILIES, check_logits_match_hf, check_parameter_names, write_checkpoint

import torch
from tpuplex.errors import TpuplexError
from tpuplex.models.weights import load_weights


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tmp_path_factory):
    return write_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("num_labels", [3, 1])
def test_logits_match_hf(family_dir, num_labels):
    check_logits_match_hf(backend(), family_dir, num_labels)


def test_parameter_names_are_the_family_s(family_dir):
    check_parameter_names(backend(), family_dir)


def test_pytorch_model_bin_reads_without_torch_as_safetensors_does(family_dir, tmp_path):
    """The core's weights-only reader of torch.save archives gives the same arrays, with no torch involved."""
    tensors = load_weights(family_dir)
    torch.save({name: torch.from_numpy(np.asarray(array)) for name, array in tensors.items()},
               tmp_path / "pytorch_model.bin")
    from_pickle = load_weights(tmp_path)
    assert from_pickle.keys() == tensors.keys()
    assert all(np.array_equal(from_pickle[name], tensors[name]) for name in tensors)


def test_pytorch_model_bin_with_bfloat16_and_views(tmp_path):
    """Tensors come out as views of their storages, mapped from the archive, not read: a block of rows reads its
    own rows, a transposed or sliced view its own elements."""
    weight = torch.randn(4, 6)
    state = {"a": weight.to(torch.bfloat16), "b": weight.t(), "c": weight[1:3], "n": torch.arange(5),
             "h": weight.half(), "s": torch.tensor(2.5)}
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = load_weights(tmp_path)
    for name, tensor in state.items():
        expected = tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()
        np.testing.assert_array_equal(loaded[name], expected)
        assert loaded[name].dtype == expected.dtype
        block = (slice(1, 2),) if tensor.dim() else ()
        np.testing.assert_array_equal(loaded[name][block], expected[block])
        base = loaded[name].stored
        while not isinstance(base, np.memmap) and base is not None:
            base = base.base
        assert isinstance(base, np.memmap), name


def test_pytorch_model_bin_that_runs_code_is_refused(tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("ran",))

    torch.save({"weight": torch.zeros(2), "payload": Payload()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(TpuplexError, match=r"print, which a weights-only load refuses"):
        load_weights(tmp_path)
