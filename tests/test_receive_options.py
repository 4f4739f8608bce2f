"""The precedence of the receive options (the table of ``ReceiveOptions.resolve``), source
against source, and the one vocabulary of ``copy=``, the environment and ``receive_mode``."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

import arrow_dataproto as adp
from arrow_dataproto import ReceiveOptions, _shm, pickling, receive_mode, receive_options, set_receive_options, transport
from arrow_dataproto.testing import assert_dataproto_equal, sample_dataproto
from test_pickling import address_ranges, data_pointers, dumps5, points_into, restore_receive_options  # noqa: F401


def views_its_buffers(obj) -> bool:
    """Whether unpickling ``obj`` (protocol 5, buffers out of band) here gives tensors viewing those buffers."""
    data, buffers = dumps5(obj)
    out = pickle.loads(data, buffers=buffers)
    pointers = data_pointers(out)
    assert pointers
    return all(points_into(p, address_ranges(buffers)) for p in pointers.values())


def read_environment(monkeypatch, **variables: str | None) -> ReceiveOptions:
    """What the environment variables ``ARROW_DATAPROTO_<NAME>`` give, each set to its value (``None``: unset)."""
    for name, value in variables.items():
        variable = f"ARROW_DATAPROTO_{name.upper()}"
        if value is not None:
            monkeypatch.setenv(variable, value)
        else:
            monkeypatch.delenv(variable, raising=False)
    return pickling._from_environment()


# ---------------------------------------------------------------- rows, pair by pair


def test_arguments_win_over_the_block_option_by_option():
    with receive_options(copy=False, device="cpu"):
        assert ReceiveOptions.resolve(copy=True) == ReceiveOptions(copy=True, device="cpu")
        assert ReceiveOptions.resolve(device="meta") == ReceiveOptions(copy=False, device="meta")
        assert ReceiveOptions.resolve() == adp.get_receive_options() == ReceiveOptions(copy=False, device="cpu")


def test_the_inner_block_wins_over_the_outer():
    with receive_options(copy=True, device="cpu"):
        with receive_options(copy=False):
            assert adp.get_receive_options() == ReceiveOptions(copy=False, device="cpu")
        assert adp.get_receive_options() == ReceiveOptions(copy=True, device="cpu")


def test_a_block_wins_over_set_receive_options(restore_receive_options):
    set_receive_options(copy=True, device="cpu")
    with receive_options(copy=False):
        assert adp.get_receive_options() == ReceiveOptions(copy=False, device="cpu")  # the device: row 3
    assert adp.get_receive_options() == ReceiveOptions(copy=True, device="cpu")


def test_set_receive_options_inside_a_block_applies_after_it(restore_receive_options):
    """A block holds everything in force when it was entered; set_receive_options changes
    the process default only, and returns it (not the block's options): it applies once
    every enclosing block has ended."""
    with receive_options(copy=False):
        assert set_receive_options(device="cpu") == ReceiveOptions(copy="on_write", device="cpu")
        assert adp.get_receive_options() == ReceiveOptions(copy=False, device=None)
        with receive_options():  # a block entered now builds on the enclosing block, not on row 3
            assert adp.get_receive_options() == ReceiveOptions(copy=False, device=None)
    assert adp.get_receive_options() == ReceiveOptions(copy="on_write", device="cpu")


def test_set_receive_options_keeps_each_option_as_last_set(restore_receive_options):
    set_receive_options(copy=False)
    set_receive_options(device="cpu")
    set_receive_options(copy=True)
    assert adp.get_receive_options() == ReceiveOptions(copy=True, device="cpu")


def test_set_receive_options_wins_over_the_environment_option_by_option():
    """In a new process, where the environment is read at import."""
    script = (
        "import arrow_dataproto as a\n"
        "print(a.get_receive_options().copy, a.get_receive_options().device)\n"
        "a.set_receive_options(copy=True)\n"
        "print(a.get_receive_options().copy, a.get_receive_options().device)\n"
    )
    env = {**os.environ, "ARROW_DATAPROTO_COPY": "0", "ARROW_DATAPROTO_DEVICE": "cpu"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["False", "cpu", "True", "cpu"]


@pytest.mark.parametrize(
    "copy, device, expected",
    [
        ("0", None, ReceiveOptions(copy=False, device=None)),  # the device: built in
        (None, "cpu", ReceiveOptions(copy="on_write", device="cpu")),  # the copy mode: built in
        ("never", "no-such-device", ReceiveOptions()),  # unusable values: skipped (logged)
    ],
)
def test_the_environment_wins_over_the_built_in_default_option_by_option(monkeypatch, copy, device, expected):
    assert read_environment(monkeypatch, copy=copy, device=device) == expected


def test_over_replaces_rows_2_to_5():
    base = ReceiveOptions(copy=True, device="cpu")
    with receive_options(copy=False):
        assert ReceiveOptions.resolve(over=base) == base
        assert ReceiveOptions.resolve(device="meta", over=base) == ReceiveOptions(copy=True, device="meta")


# ---------------------------------------------------------------- the sender's receive_as


def test_receive_as_wins_over_the_receivers_block():
    dp = sample_dataproto()
    with receive_options(copy=True):
        assert views_its_buffers(transport.receive_as(dp, copy=False))
    with receive_options(copy=False):
        assert not views_its_buffers(transport.receive_as(dp, copy=True))


def test_what_receive_as_leaves_unset_is_the_receivers():
    dp = sample_dataproto()
    with receive_options(copy=False):
        assert views_its_buffers(transport.receive_as(dp, device="cpu"))
        assert views_its_buffers(transport.receive_as(dp))
    assert not views_its_buffers(transport.receive_as(dp))  # the receiver's default: copy-on-write (a copy here)
    data, buffers = dumps5(transport.receive_as(dp, copy=False))
    assert_dataproto_equal(dp, pickle.loads(data, buffers=buffers))
    assert adp.get_receive_options() == ReceiveOptions()  # nothing leaked out of the parcel


# ---------------------------------------------------------------- errors leave everything as it was


def test_a_refused_option_changes_nothing(restore_receive_options):
    set_receive_options(copy=False)
    with receive_options(device="cpu"):
        for refused in (
            lambda: ReceiveOptions.resolve(copy="sometimes"),
            lambda: ReceiveOptions.resolve(device="no-such-device"),
            lambda: set_receive_options(copy="yes"),
            lambda: receive_options(copy=2).__enter__(),
        ):
            with pytest.raises(adp.OptionError):
                refused()
        assert adp.get_receive_options() == ReceiveOptions(copy=False, device="cpu")
    assert adp.get_receive_options() == ReceiveOptions(copy=False, device=None)


# ---------------------------------------------------------------- one vocabulary


@pytest.mark.parametrize(
    "word, copy",
    [("on_write", "on_write"), ("On-Write", "on_write"), ("1", True), ("yes", True), ("0", False), ("off", False)],
)
def test_environment_words_are_the_copy_values(monkeypatch, word, copy):
    assert read_environment(monkeypatch, copy=word, device=None) == ReceiveOptions(copy=copy)


@pytest.mark.parametrize(
    "copy, device, views",
    [("on_write", None, True), ("on_write", "cpu", True), ("on_write", "meta", False), (True, None, False), (False, None, False)],
)
def test_copy_on_write_views_only_where_on_write_keeps_tensors_on_the_cpu(copy, device, views):
    """The one decision both pickled forms' receives follow (the Arrow state's and verl's compact one)."""
    assert ReceiveOptions(copy=copy, device=device).copy_on_write_views is views


def test_receive_mode_names_each_copy_value():
    asked = {True: "copy", False: "view"}
    for copy, mode in asked.items():
        with receive_options(copy=copy):
            assert receive_mode().mode == mode
            assert receive_mode().reason.startswith(f"copy={copy} was asked for")
    with receive_options(copy="on_write"):
        mode, reason = receive_mode()
    unavailable = _shm.unavailable_reason()
    if unavailable is None:
        assert mode == "on_write"
    else:  # copy-on-write falls back to copying, and says why
        assert (mode, reason) == ("copy", f"copy-on-write is unavailable here: {unavailable}")
    with receive_options(copy=False, device="meta"):
        assert receive_mode() == ("copy", "tensors are decoded onto meta: the transfer is the copy")
