"""Kubernetes quantities parse exactly, compare by value and keep their written form."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from localcache.api.quantity import CRD_PATTERN, Quantity, QuantityError


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1", 1),
        ("1Ki", 1024),
        ("1Mi", 1024**2),
        ("1Gi", 1024**3),
        ("2Ti", 2 * 1024**4),
        ("1Pi", 1024**5),
        ("1Ei", 1024**6),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("100m", Fraction(1, 10)),
        ("5u", Fraction(5, 10**6)),
        ("7n", Fraction(7, 10**9)),
        ("1e3", 1000),
        ("1E3", 1000),
        ("12e-1", Fraction(6, 5)),
        ("1.5Gi", 3 * 512 * 1024**2),
        ("0.1", Fraction(1, 10)),
        (".5", Fraction(1, 2)),
        ("2.", 2),
        ("+3k", 3000),
        ("-2Ki", -2048),
        ("251Mi", 251 * 1024**2),
    ],
)
def test_quantities_parse_exactly(text: str, value: Fraction | int) -> None:
    assert Quantity(text).value == value


def test_integers_are_quantities() -> None:
    assert Quantity(1073741824) == Quantity("1Gi")
    assert Quantity(0).value == 0


@pytest.mark.parametrize(
    "bad", ["lots", "", " 1Gi", "1Gi ", "1gi", "1KiB", "1e1.5", "Gi", "1.2.3", "--1", "1e", "0x10"]
)
def test_bad_quantities_are_rejected_with_a_clear_error(bad: str) -> None:
    with pytest.raises(QuantityError, match=re.escape(repr(bad)) + ".*expected a number"):
        Quantity(bad)


@pytest.mark.parametrize("bad", [True, False, 1.5, 1.0, None, ["1Gi"]])
def test_non_string_non_integer_values_are_rejected(bad: Any) -> None:
    with pytest.raises(QuantityError, match="expected a string"):
        Quantity(bad)


def test_huge_exponents_are_rejected_instead_of_computed() -> None:
    with pytest.raises(QuantityError, match="exponent"):
        Quantity("1e999999999")


def test_comparison_uses_the_value() -> None:
    assert Quantity("1Gi") > Quantity("900Mi")
    assert Quantity("900Mi") < Quantity("1Gi")
    assert Quantity("1G") < Quantity("1Gi")
    assert Quantity("1Gi") == Quantity("1024Mi")
    assert Quantity("1Gi") >= Quantity("1024Mi")
    assert Quantity("1k") <= 1000
    assert Quantity("1k") == 1000
    assert hash(Quantity("1Gi")) == hash(Quantity("1024Mi"))
    assert len({Quantity("1Gi"), Quantity("1024Mi"), Quantity(1073741824)}) == 1
    assert Quantity("1") != "1"


def test_written_form_is_kept() -> None:
    assert Quantity("1024Mi").raw == "1024Mi"
    assert str(Quantity("1024Mi")) == "1024Mi"
    assert Quantity(5).raw == 5
    assert repr(Quantity("1Gi")) == "Quantity('1Gi')"


def test_int_rounds_up_like_kubernetes_value() -> None:
    assert int(Quantity("1Gi")) == 1073741824
    assert int(Quantity("100m")) == 1
    assert int(Quantity("1500m")) == 2


@pytest.mark.parametrize(
    ("value", "binary", "text"),
    [
        (0, True, "0"),
        (2 * 1024**3, True, "2Gi"),
        (1536 * 1024**2, True, "1536Mi"),
        (1500, True, "1500"),
        (10**18, True, "1E"),
        (2000, False, "2k"),
        (1024, False, "1024"),
        (Fraction(1, 10), True, "100m"),
        (Fraction(1, 3), True, "333333334n"),
        (-2048, True, "-2Ki"),
    ],
)
def test_from_value_writes_canonical_form(value: int | Fraction, binary: bool, text: str) -> None:
    assert Quantity.from_value(value, binary=binary).raw == text


def test_arithmetic_keeps_exact_values() -> None:
    total = Quantity("1Gi") + Quantity("512Mi")
    assert total == Quantity("1536Mi")
    assert total.raw == "1536Mi"
    assert Quantity("2Gi") - Quantity("1536Mi") == Quantity("512Mi")
    assert sum([Quantity("1Gi"), Quantity("1Gi")], Quantity(0)) == Quantity("2Gi")


class _Holder(pydantic.BaseModel):
    size: Quantity
    limit: Quantity | None = None


def test_pydantic_fields_validate_and_serialise_quantities() -> None:
    held = _Holder.model_validate({"size": "10Gi", "limit": 5})
    assert held.size == Quantity("10Gi")
    assert held.model_dump(mode="json") == {"size": "10Gi", "limit": 5}
    assert held.model_dump() == {"size": "10Gi", "limit": 5}
    with pytest.raises(pydantic.ValidationError, match="size"):
        _Holder.model_validate({"size": "lots"})


_numbers = st.one_of(
    st.from_regex(r"[0-9]{1,8}", fullmatch=True),
    st.from_regex(r"[0-9]{1,6}\.[0-9]{0,6}", fullmatch=True),
    st.from_regex(r"\.[0-9]{1,6}", fullmatch=True),
)
_SI_SUFFIXES = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"]
_suffixes = st.sampled_from([*_SI_SUFFIXES, "e3", "E-2", "e+5"])


@given(sign=st.sampled_from(["", "+", "-"]), number=_numbers, suffix=_suffixes)
def test_everything_we_accept_matches_the_crd_pattern(sign: str, number: str, suffix: str) -> None:
    text = sign + number + suffix
    Quantity(text)
    assert re.fullmatch(CRD_PATTERN, text)


@given(a=st.integers(min_value=0, max_value=2**70), b=st.integers(min_value=0, max_value=2**70))
def test_order_of_quantities_is_the_order_of_their_values(a: int, b: int) -> None:
    qa, qb = Quantity.from_value(a), Quantity.from_value(b)
    assert (qa < qb) == (a < b)
    assert (qa == qb) == (a == b)
    assert Quantity(qa.raw).value == a
