"""Encode the ``meta_info`` of a DataProto in schema metadata, and decode it.

:func:`encode_meta_info` stores ``meta_info`` in schema metadata: ``adp.meta_info`` holds
the payload and ``adp.meta_info.encoding`` says how: ``"json"`` when JSON (without NaN or
infinities) gives the dict back with the same types, ``"json+tensors"`` (since 1.3) when the
values JSON lacks are only tensors (each a tagged dict, bit-exact), else ``"pickle"`` (base64
of a protocol-5 pickle; refusing it without ``allow_pickle`` names the keys that need it).
Neither direction imports torch unless a tensor is met.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import warnings
from typing import Any, Callable

from ._format import META_INFO, META_INFO_ENCODING
from ._json import JSON_DECODER, same
from .errors import PICKLE_REFUSED, DecodeError, EncodeError, PickleNotAllowedError, UnknownContentError


TENSOR_TAG = "adp.tensor"
"""In ``json+tensors`` meta_info (since 1.3), a dict of this one key is a tensor: ``{"dtype":
torch dtype name, "shape": [...], "device": "cpu", "data": base64 of its bytes, row-major}``."""


class _NeedsPickle(Exception):
    """A value of meta_info that neither JSON nor the tensor tag holds; ``args[0]`` says where."""


def _tagged(value: Any, where: str) -> Any:
    """``value`` with each tensor replaced by its tag (:data:`TENSOR_TAG`); :class:`_NeedsPickle`
    for what only pickle holds exactly: a tuple, a non-``str`` dict key, a dict that has the tag's
    key, a tensor with gradients, of a subclass, a layout other than strided or a dtype without
    storage. Other values are returned as they are (JSON's round trip decides on them)."""
    import torch  # here, not at module level: reading a file's meta_info (the CLI) needs no torch

    from ._dtypes import STORAGE, dtype_name

    kind = type(value)
    if kind is torch.Tensor:
        if value.layout != torch.strided or value.requires_grad or value.dtype not in STORAGE or value.is_nested:
            raise _NeedsPickle(where)
        flat = value.detach().resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
        data = base64.b64encode(flat.view(torch.uint8).numpy().tobytes()).decode("ascii")
        record = {"dtype": dtype_name(value.dtype), "shape": list(value.shape), "device": str(value.device), "data": data}
        return {TENSOR_TAG: record}
    if kind is dict:
        if TENSOR_TAG in value or not all(type(k) is str for k in value):
            raise _NeedsPickle(where)
        return {k: _tagged(v, f"{where}[{k!r}]") for k, v in value.items()}
    if kind is list:
        return [_tagged(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if kind is tuple or isinstance(value, torch.Tensor):
        raise _NeedsPickle(where)
    return value


def _json_with_tensors(meta_info: dict) -> str | None:
    """The ``json+tensors`` text of ``meta_info`` if it gives it back exactly, else None."""
    try:
        tagged = _tagged(meta_info, "meta_info")
        text = json.dumps(tagged, allow_nan=False)
        return text if same(tagged, json.loads(text)) else None
    except (_NeedsPickle, TypeError, ValueError, RecursionError):
        return None


def pickled_meta_keys(meta_info: dict) -> list[str]:
    """The keys of ``meta_info`` whose values need pickling (neither JSON nor tensors)."""
    return [repr(k) for k, v in meta_info.items() if type(k) is not str or _json_with_tensors({k: v}) is None]


def encode_meta_info(meta_info: dict) -> dict[str, str]:
    """Encode ``meta_info`` as schema-metadata entries (``adp.meta_info*`` keys).

    JSON when that round-trips exactly (same values and types, no NaN/infinity); else, when
    the values JSON lacks are only tensors (plain strided tensors of any dtype with storage,
    without gradients), ``json+tensors``: JSON with each tensor as its tag (:data:`TENSOR_TAG`,
    bit-exact: dtype, shape, device, bytes); else a base64-encoded protocol-5 pickle
    (:func:`pickled_meta_keys` names the keys that need it).

    Raises:
        EncodeError: ``meta_info`` is not a dict, or needs pickling and cannot be pickled.
    """
    if not isinstance(meta_info, dict):
        raise EncodeError(f"meta_info must be a dict, got {type(meta_info).__name__}")
    try:
        text = json.dumps(meta_info, allow_nan=False)
        if same(meta_info, json.loads(text)):
            return {META_INFO_ENCODING: "json", META_INFO: text}
    except (TypeError, ValueError, RecursionError):  # not JSON-serialisable
        pass
    tagged = _json_with_tensors(meta_info)
    if tagged is not None:
        return {META_INFO_ENCODING: JSON_TENSORS, META_INFO: tagged}
    try:
        blob = pickle.dumps(meta_info, protocol=5)
    except Exception as exc:
        raise EncodeError(f"meta_info is neither JSON nor picklable: {exc}") from exc
    return {META_INFO_ENCODING: "pickle", META_INFO: base64.b64encode(blob).decode("ascii")}


JSON_TENSORS = "json+tensors"


def _untagged(value: Any) -> Any:
    """Invert :func:`_tagged` on parsed JSON (tensors on the CPU, then moved to their recorded
    device when this process has it). Checks sizes before allocating."""
    if type(value) is list:
        return [_untagged(v) for v in value]
    if type(value) is not dict:
        return value
    if list(value) != [TENSOR_TAG]:
        return {k: _untagged(v) for k, v in value.items()}
    record = value[TENSOR_TAG]
    if type(record) is not dict or set(record) != {"dtype", "shape", "device", "data"}:
        raise ValueError("malformed tensor tag")
    import torch  # only for a tensor tag: meta_info without tensors decodes without torch

    from ._dtypes import dtype_from_name

    dtype = dtype_from_name(str(record["dtype"]), "meta_info")
    shape = record["shape"]
    if type(shape) is not list or not all(type(d) is int and 0 <= d < 2**63 for d in shape):
        raise ValueError(f"malformed tensor shape {str(shape)[:80]}")
    data = base64.b64decode(str(record["data"]), validate=True)
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for d in shape:
        numel *= d
    if numel * itemsize != len(data):
        raise ValueError(f"a tensor of shape {shape} and dtype {dtype} in {len(data)} bytes")
    tensor = torch.empty(shape, dtype=dtype)
    if numel:
        tensor.reshape(-1).view(torch.uint8).copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    device = str(record["device"])
    if device != "cpu":
        try:
            tensor = tensor.to(device)
        except (RuntimeError, ValueError, AssertionError):
            warnings.warn(f"meta_info: a tensor recorded on {device[:40]!r} stays on the CPU (no such device here)", stacklevel=2)
    return tensor


class _Opaque:
    """What :class:`_KeysOnly` makes of every object a pickle names: nothing is imported or run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _KeysOnly(pickle.Unpickler):
    """An unpickler that never imports nor calls anything of the pickle's: each global it names
    is :class:`_Opaque` (so reading a refused pickle's keys is safe)."""

    def find_class(self, module: str, name: str) -> Any:
        return _Opaque

    def persistent_load(self, pid: Any) -> Any:
        return _Opaque()


def _refused_keys(payload: str) -> str:
    """`` (keys 'a', 'b')``: the keys of a pickled meta_info whose values need pickling, read
    without running the pickle (every class or function it names is :class:`_Opaque`); empty
    if they cannot be told."""
    try:
        loaded = _KeysOnly(io.BytesIO(base64.b64decode(payload, validate=True))).load()
        keys = pickled_meta_keys(loaded) if type(loaded) is dict else []
    except Exception:  # a malformed pickle: the refusal says no more
        return ""
    return f" (key{'s' if len(keys) > 1 else ''} {', '.join(keys)[:300]})" if keys else ""


_META_INFO_LOADERS: dict[str, Callable[[str], Any]] = {
    "json": JSON_DECODER.decode,  # strict: a duplicate key or a number no double holds is an error
    JSON_TENSORS: lambda text: _untagged(JSON_DECODER.decode(text)),
    "pickle": lambda text: pickle.loads(base64.b64decode(text, validate=True)),
}


def decode_meta_info(metadata: dict[str, str], *, allow_pickle: bool) -> dict:
    """Invert :func:`encode_meta_info`; ``{}`` when ``metadata`` holds no meta_info.

    Raises:
        PickleNotAllowedError: meta_info is pickled and ``allow_pickle`` is false (naming the
            keys whose values need it, read without unpickling anything).
        DecodeError: the entries are inconsistent, malformed, or not a dict.
    """
    encoding, payload = metadata.get(META_INFO_ENCODING), metadata.get(META_INFO)
    if encoding is None and payload is None:
        return {}
    if encoding is not None and encoding not in _META_INFO_LOADERS:
        raise UnknownContentError(f"meta_info: unknown encoding {META_INFO_ENCODING}={encoding[:40]!r}")
    if encoding is None or payload is None:
        raise DecodeError(f"bad meta_info entries: {META_INFO_ENCODING}={encoding!r}, {META_INFO} {'missing' if payload is None else 'present'}")
    if encoding == "pickle" and not allow_pickle:
        raise PickleNotAllowedError(f"meta_info{_refused_keys(payload)} {PICKLE_REFUSED}")
    try:
        meta_info = _META_INFO_LOADERS[encoding](payload)
    except Exception as exc:  # json, base64 and unpickling errors of any type
        raise DecodeError(f"malformed {encoding} meta_info: {exc!r}") from exc
    if not isinstance(meta_info, dict):
        raise DecodeError(f"meta_info must decode to a dict, got {type(meta_info).__name__}")
    return meta_info
