"""Canaries of arrow_dataproto._compat: one per private API of another project that we use.

Each asserts that the private API exists and behaves as arrow-dataproto relies on, so the
upgrade that changes one fails here, naming it (see the entry's docstring for the way out).
"""

from __future__ import annotations

import importlib
import inspect
import io
import json
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

from arrow_dataproto import _compat

# --- CPython ------------------------------------------------------------------------------


def test_c_make_encoder_exists_and_writes_what_json_dumps_writes():
    assert json.encoder.c_make_encoder is not None  # CPython's C accelerator, the fast path
    encode = _compat.ascii_json_encoder()
    values = [None, True, 0, -(2**63), 2**63 - 1, 1.5, -0.0, 1e-300, "", "é\u2028\ud83d", "\ud800",
              [], {}, [1, [2, {"k": "v", "é": [None]}]], {"a": {"b": {"c": [1.25, "x"]}}}]
    for value in values:
        assert encode(value) == json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        assert encode(value).isascii()


def test_python_unpickler_is_the_pure_python_one_with_a_dict_memo():
    assert _compat.PythonUnpickler is not pickle.Unpickler
    assert _compat.PythonUnpickler.__module__ == "pickle"
    # NONE, LONG_BINPUT at memo index 2**31 - 1, STOP: the C unpickler would size its memo
    # table for 2**31 entries (16 GiB); the Python one stores one dict entry.
    unpickler = _compat.PythonUnpickler(io.BytesIO(b"\x80\x04Nr\xff\xff\xff\x7f."))
    assert unpickler.load() is None
    assert unpickler.memo == {2**31 - 1: None}


def test_python_unpickler_asks_an_overridden_find_class():
    asked = []

    class Recording(_compat.PythonUnpickler):
        def find_class(self, module, name):
            asked.append((module, name))
            return super().find_class(module, name)

    assert Recording(io.BytesIO(pickle.dumps(io.BytesIO))).load() is io.BytesIO
    assert asked == [("_io", "BytesIO")]


def test_python_pickle_load_goes_through_the_python_unpickler(monkeypatch):
    value = {"a": [1, 2.5, "x"], "b": (None, b"\x00")}
    assert _compat.python_pickle_load(io.BytesIO(pickle.dumps(value, protocol=5)), encoding="ASCII") == value
    used = []

    class Recording(pickle._Unpickler):  # type: ignore[name-defined]
        def load(self):
            used.append(True)
            return super().load()

    monkeypatch.setattr(pickle, "_Unpickler", Recording)
    assert _compat.python_pickle_load(io.BytesIO(pickle.dumps(value))) == value
    assert used == [True]


# --- torch --------------------------------------------------------------------------------


@pytest.mark.parametrize("jagged_dim", [1, 2])
def test_ragged_idx_is_the_jagged_dim(jagged_dim):
    values = torch.zeros(5, 3, 2) if jagged_dim == 1 else torch.zeros(3, 5, 2)
    t = torch.nested.nested_tensor_from_jagged(values, torch.tensor([0, 2, 5]), jagged_dim=jagged_dim)
    assert _compat.ragged_idx(t) == jagged_dim
    assert _compat.ragged_idx(t.clone()) == jagged_dim
    assert [isinstance(n, torch.SymInt) for n in t.shape] == [i == jagged_dim for i in range(t.dim())]


def test_nested_tensor_size_gives_the_row_shapes():
    t = torch.nested.as_nested_tensor([torch.zeros(2, 3), torch.zeros(1, 4), torch.zeros(0, 5)], layout=torch.strided)
    sizes = _compat.nested_tensor_size(t)
    assert sizes.dtype == torch.int64
    assert sizes.tolist() == [[2, 3], [1, 4], [0, 5]]


def test_nested_view_from_buffer_views_the_values_without_a_copy():
    values = torch.arange(10.0)
    sizes = torch.tensor([[2, 3], [1, 4]])
    strides = torch.tensor([[3, 1], [4, 1]])
    t = _compat.nested_view_from_buffer(values, sizes, strides, torch.tensor([0, 6]))
    assert t.is_nested and t.layout == torch.strided
    rows = t.unbind()
    assert torch.equal(rows[0], values[:6].view(2, 3)) and torch.equal(rows[1], values[6:].view(1, 4))
    values[7] = -1.0  # a view: the change shows through
    assert t.unbind()[1][0, 1].item() == -1.0


def test_jagged_class_is_the_class_of_every_jagged_tensor_and_builds_what_torch_builds():
    cls = _compat.jagged_class()
    assert cls is not None
    values, offsets = torch.arange(12.0).view(6, 2), torch.tensor([0, 2, 2, 6])
    public = torch.nested.nested_tensor_from_jagged(values, offsets)
    assert isinstance(public, cls) and public.layout == torch.jagged
    assert not isinstance(torch.nested.nested_tensor([torch.zeros(2)], layout=torch.strided), cls)
    built = cls(values, offsets, _ragged_idx=1)
    assert built.layout == torch.jagged and built.shape[0] == 3 and built.shape[2] == 2
    assert built.shape[1] == public.shape[1]  # the same ragged size: they combine
    assert all(torch.equal(a, b) for a, b in zip(built.unbind(), public.unbind()))
    assert built._values is values and built._offsets is offsets and built._lengths is None
    assert public._values.data_ptr() == values.data_ptr() and public._lengths is None
    assert _compat.ragged_idx(cls(torch.zeros(2, 6), offsets, _ragged_idx=2)) == 2


def test_torch_function_off_skips_the_jagged_class_hook_and_keeps_its_attributes():
    t = torch.nested.nested_tensor_from_jagged(torch.arange(6.0), torch.tensor([0, 2, 6])).requires_grad_()
    seen = []
    original = type(t).__torch_function__.__func__

    def spy(cls, func, types, args=(), kwargs=None):
        seen.append(func)
        return original(cls, func, types, args, kwargs)

    type(t).__torch_function__ = classmethod(spy)
    try:
        with _compat.torch_function_off():
            read = (t.device, t.dtype, t.requires_grad, t.is_nested)
        assert not seen
        t.requires_grad  # outside: the hook runs again
        assert seen
    finally:
        type(t).__torch_function__ = classmethod(original)
    assert read == (torch.device("cpu"), torch.float32, True, True)


def test_the_fx_notice_is_logged_by_the_module_we_filter():
    module = importlib.import_module(_compat.FX_TRACE_LOGGER)
    assert module.log.name == _compat.FX_TRACE_LOGGER
    assert "is_fx_tracing will return true" in inspect.getsource(module)


# --- Ray ----------------------------------------------------------------------------------

_PROBE = textwrap.dedent(
    """
    import ray._private.worker
    from arrow_dataproto._compat import ray_external_transport

    seen = []

    class Probe:
        def __reduce__(self):
            seen.append(ray_external_transport())
            return int, ()

    worker = ray._private.worker.global_worker
    assert ray_external_transport() is False
    assert not worker.serialization_context_map  # asking made no context (making one imports pydantic)
    context = worker.get_serialization_context()
    context.serialize_rdt_objects(Probe(), "GLOO")
    assert seen == [True], seen
    assert ray_external_transport() is False
    """
)


def test_ray_external_transport_is_true_inside_direct_transport_serialization():
    pytest.importorskip("ray", reason="ray is not installed (pip install arrow-dataproto[ray])")
    # A child process: serialize_rdt_objects registers serializers in this process's Ray context.
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_ray_external_transport_is_false_without_ray(monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert _compat.ray_external_transport() is False
