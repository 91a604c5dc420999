"""canonical_bytes' C-encoder path writes exactly what rfc8785 writes, or refuses what it refuses.

Hostile values: floats either side of the ranges where ``repr`` and ECMAScript
format apart (1e-4, 1e16, 2^53, 1e21), -0.0, integers at and past +-(2^53-1),
control characters, U+2028, U+FFFF, characters beyond the BMP in keys (RFC 8785
orders keys by UTF-16 code units, Python by code points), lone surrogates,
non-string keys, subclasses, NaN and the infinities.
"""

from __future__ import annotations

import enum
import json
import math
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from hypothesis import example, given, settings
from hypothesis import strategies as st

from manifest import canonical, jcs
from manifest.canonical import canonical_bytes, dumps, load_manifest, seal
from manifest.errors import InvalidManifestError

GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"

EDGE_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-4, 9.999999999999999e-05, 1e-5, 1e-6, 1e-7,
               1.5e-7, 123.456, 1e15 + 0.5, 1e16, 9999999999999998.0, 2.0**53, 2.0**53 + 2,
               2.0**60, 1e20, 1e21, 1e22, 1.7976931348623157e308, 5e-324, 0.1 + 0.2,
               math.nan, math.inf, -math.inf]
EDGE_INTS = [0, -1, 2**53 - 1, -(2**53 - 1), 2**53, -(2**53), 2**64, -(2**70), 10**30]
EDGE_TEXT = ["", "a", '"', "\\", "\x00", "\x1f", "\x7f", "\b\f\n\r\t", "\u2028\u2029", "\ufeff",
             "\uffff", "\ue000", "\U0001f600", "\U00010000", "\ud800", "\udfff", "é", "\u20ac"]


class Colour(enum.StrEnum):
    RED = "red"


class Count(int):
    pass


def reference(value: Any) -> bytes | type[BaseException]:
    """rfc8785's bytes, or the kind of error it raises."""
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError):  # a lone surrogate as a key
        return InvalidManifestError
    except RecursionError:
        return RecursionError


def ours(value: Any) -> bytes | type[BaseException]:
    try:
        return canonical_bytes(value)
    except InvalidManifestError:
        return InvalidManifestError
    except RecursionError:
        return RecursionError


scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60), st.sampled_from(EDGE_INTS),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(EDGE_FLOATS),
    st.text(), st.sampled_from(EDGE_TEXT),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF)),
)
keys = st.one_of(st.text(max_size=6), st.sampled_from(EDGE_TEXT),
                 st.text(alphabet=st.sampled_from(["a", "\ue000", "\uffff", "\U0001f600",
                                                   "\U00010000", "z"]), max_size=3))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5),
                            st.lists(inner, max_size=3).map(tuple),
                            st.dictionaries(keys, inner, max_size=6)),
    max_leaves=30)


@settings(max_examples=600, deadline=None)
@given(values)
@example({"\ue000": 1, "\U0001f600": 2})  # UTF-16 puts the astral key first
@example({"lr": 1e-5, "steps": 1.0, "zero": -0.0, "big": 2.0**60})
@example([2**53 - 1, -(2**53 - 1)])
@example({"k": "\ud800"})
def test_matches_rfc8785(value: Any) -> None:
    assert ours(value) == reference(value)


@pytest.mark.parametrize("value", [
    *EDGE_FLOATS, *EDGE_INTS, *EDGE_TEXT,
    {1: "int key"}, {None: 1}, {1.5: 1}, {True: 1}, {"a": 1, 2: 3},
    Colour.RED, {"c": Colour.RED}, Count(3), {"n": Count(2**60)},
    {"s": {1, 2}}, {"b": b"bytes"}, {"o": object()},
])
def test_hostile_values(value: Any) -> None:
    assert ours(value) == reference(value)


def test_a_cycle_is_refused_as_rfc8785_refuses_it() -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert ours(loop) is RecursionError is reference(loop)


def test_the_c_path_is_taken_on_a_manifest() -> None:
    """The control: a real manifest goes through the C encoder (else this file tests nothing
    of it), and a planted float in [1e-4, 1e16) stays on it while 1e-05 leaves it."""
    doc = json.loads(GOLDEN.read_bytes())
    assert jcs._c_encodable(doc)
    assert jcs._c_encodable({"x": 0.25}) and not jcs._c_encodable({"x": 1e-5})
    assert canonical_bytes(doc) == rfc8785.dumps(doc)


def test_seal_joins_members_as_rfc8785_writes_the_whole() -> None:
    doc = json.loads(GOLDEN.read_bytes())
    sealed = seal(doc)
    written = dumps(sealed)
    whole = rfc8785.dumps(canonical.to_document(sealed))
    assert written == whole
    assert load_manifest(written).run_id == sealed.run_id
    canonical._LAST_SEALED = None  # the cache off: the same bytes by the long way
    assert dumps(sealed) == whole
