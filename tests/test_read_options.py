"""ReadOptions: the readers' options as one frozen object, and the keywords that build it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from arrow_dataproto.testing import assert_dataproto_equal, sample_dataproto

from arrow_dataproto.errors import ArgumentTypeError, PickleNotAllowedError
from arrow_dataproto.files import DatasetReader, FileReader, ReadOptions, open_dataset, open_file, read_file, write_file
from arrow_dataproto.files.options import ReadKeywords


@pytest.fixture
def path(tmp_path):
    dp = sample_dataproto(rows=6)
    dp.non_tensor_batch["objects"] = np.array([{i} for i in range(6)], dtype=object)  # sets: pickled
    write_file(tmp_path / "a.arrow", [dp])
    return tmp_path / "a.arrow"


def test_the_defaults_are_the_readers_and_the_object_is_frozen(path):
    options = ReadOptions()
    assert (options.allow_pickle, options.device, options.copy, options.progress) == (False, None, False, False)
    assert (options.max_decoded_bytes, options.verify, options.schema) == ("auto", False, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.copy = True  # type: ignore[misc]
    with open_file(path) as reader:
        assert reader.options == options


def test_the_keywords_are_the_fields():
    keywords = {name: hint.__forward_arg__ for name, hint in ReadKeywords.__annotations__.items()}
    assert keywords == {f.name: f.type for f in dataclasses.fields(ReadOptions)}


@pytest.mark.parametrize("bad", [
    {"allow_pickle": "yes"}, {"copy": 1}, {"progress": None}, {"verify": "no"},
    {"device": 0}, {"max_decoded_bytes": -1}, {"max_decoded_bytes": "big"}, {"schema": 42},
])
def test_values_of_another_type_are_refused_when_built(bad, path):
    with pytest.raises(ArgumentTypeError, match=next(iter(bad))):
        ReadOptions(**bad)
    with pytest.raises(ArgumentTypeError, match=next(iter(bad))):
        open_file(path, **bad)


def test_devices_as_strings_and_torch_devices_are_taken():
    assert ReadOptions(device="cpu").device == "cpu"
    assert ReadOptions(device=torch.device("cpu")).device == torch.device("cpu")


def test_each_entry_point_takes_options_and_reads_as_the_keywords_do(path):
    options = ReadOptions(allow_pickle=True, copy=True)
    by_keywords = read_file(path, allow_pickle=True, copy=True)
    assert by_keywords.non_tensor_batch["objects"][2] == {2}
    assert_dataproto_equal(read_file(path, options=options), by_keywords)
    for reader in (open_file(path, options=options), FileReader(path, options=options),
                   open_dataset([path, path], options=options), DatasetReader([path], options=options)):
        with reader:
            assert reader.options == options and reader.allow_pickle and reader.copy
            assert_dataproto_equal(reader.read_batch(0), by_keywords)
    with open_dataset([path, path], options=options) as dataset:
        assert all(f.options == dataclasses.replace(options, progress=False, schema=None) for f in dataset.files)


def test_a_keyword_given_with_options_replaces_that_field(path):
    with open_file(path, options=ReadOptions(allow_pickle=True, copy=True), copy=False) as reader:
        assert reader.options == ReadOptions(allow_pickle=True, copy=False)
    with pytest.raises(PickleNotAllowedError):
        read_file(path, options=ReadOptions(allow_pickle=True), allow_pickle=False)
    with open_dataset([path], options=ReadOptions(verify=False), max_decoded_bytes=None) as dataset:
        assert dataset.options == ReadOptions(max_decoded_bytes=None)


def test_a_misspelt_keyword_or_options_of_another_type_are_refused(path):
    for call in (read_file, open_dataset, open_file):
        with pytest.raises(TypeError, match="allow_pikle"):
            call(path, allow_pikle=True)  # type: ignore[operator]
        with pytest.raises(TypeError, match="allow_pikle"):
            call(path, options=ReadOptions(), allow_pikle=True)  # type: ignore[operator]
        with pytest.raises(ArgumentTypeError, match="ReadOptions"):
            call(path, options={"copy": True})  # type: ignore[operator]
