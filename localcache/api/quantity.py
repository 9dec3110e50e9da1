"""Kubernetes resource quantities (`1Gi`, `500M`, `100m`, `1e9`), parsed exactly.

`Quantity` keeps two things: the value as an exact `Fraction` (never a float, so `1Gi` and
`1073741824` are equal and `0.1` is exactly a tenth) and the raw form it was written in (a
string or an integer), which is what it serialises back to, so a round trip through the models
changes nothing. Comparison, hashing and arithmetic use the value only: `Quantity("1Gi") >
Quantity("900Mi")` and `Quantity("1Gi") == Quantity("1024Mi")`.

Grammar (the one `k8s.io/apimachinery/pkg/api/resource` accepts):

    quantity  ::= [+-] number [suffix]
    number    ::= digits | digits "." [digits] | "." digits
    suffix    ::= Ki | Mi | Gi | Ti | Pi | Ei            (powers of 1024)
                | n | u | m | k | M | G | T | P | E     (powers of 1000)
                | ("e" | "E") [+-] digits              (decimal exponent)

`CRD_PATTERN` is the regular expression controller-gen puts on quantity fields of a CRD; the
server enforces it. This parser accepts a subset of it (the exponent must be an integer, as in
Go's parser), so anything we parse the server also accepts.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any, Final

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

CRD_PATTERN: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

BINARY_SUFFIXES: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
DECIMAL_SUFFIXES: Final = {
    "n": -3,
    "u": -2,
    "m": -1,
    "k": 1,
    "M": 2,
    "G": 3,
    "T": 4,
    "P": 5,
    "E": 6,
}

MAX_EXPONENT: Final = 100

_GRAMMAR = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_HELP = (
    "expected a number with an optional suffix: Ki, Mi, Gi, Ti, Pi, Ei (powers of 1024), "
    "n, u, m, k, M, G, T, P, E (powers of 1000) or an exponent such as e9; for example 10Gi"
)


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


def _parse(raw: str) -> Fraction:
    match = _GRAMMAR.fullmatch(raw)
    if match is None:
        raise QuantityError(f"invalid quantity {raw!r}: {_HELP}")
    number = Fraction(match["number"])
    suffix = match["suffix"] or ""
    if suffix in BINARY_SUFFIXES:
        number *= 1024 ** BINARY_SUFFIXES[suffix]
    elif suffix[:1] in ("e", "E") and len(suffix) > 1:
        exponent = int(suffix[1:])
        if abs(exponent) > MAX_EXPONENT:
            raise QuantityError(f"invalid quantity {raw!r}: exponent beyond +-{MAX_EXPONENT}")
        number *= Fraction(10) ** exponent
    elif suffix:
        number *= Fraction(1000) ** DECIMAL_SUFFIXES[suffix]
    return -number if match["sign"] == "-" else number


def _format(value: Fraction, *, binary: bool) -> str:
    if not binary:
        return _format_in(value, binary=False)
    # Binary suffixes where they are exact and no longer than the decimal form (2Gi, 1536Mi),
    # decimal ones otherwise (1E rather than 976562500000000Ki).
    as_binary, as_decimal = _format_in(value, binary=True), _format_in(value, binary=False)
    return as_binary if len(as_binary) <= len(as_decimal) else as_decimal


def _format_in(value: Fraction, *, binary: bool) -> str:
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    if magnitude.denominator == 1:
        whole = magnitude.numerator
        if whole == 0:
            return "0"
        if binary:
            for suffix, power in reversed(BINARY_SUFFIXES.items()):
                if whole % (1024**power) == 0:
                    return f"{sign}{whole // 1024**power}{suffix}"
            return f"{sign}{whole}"
        for suffix, power in reversed(DECIMAL_SUFFIXES.items()):
            if power > 0 and whole % (1000**power) == 0:
                return f"{sign}{whole // 1000**power}{suffix}"
        return f"{sign}{whole}"
    for suffix, scale in (("m", 10**3), ("u", 10**6), ("n", 10**9)):
        scaled = magnitude * scale
        if scaled.denominator == 1:
            return f"{sign}{scaled.numerator}{suffix}"
    # Finer than a nano: round away from zero to whole nanos, as Kubernetes does.
    return f"{sign}{math.ceil(magnitude * 10**9)}n"


class Quantity:
    """An exact Kubernetes quantity that remembers how it was written.

    `Quantity("10Gi")`, `Quantity(1024)`; `QuantityError` (a `ValueError`) for anything else,
    including booleans and floats. `int(q)` rounds up to a whole number (bytes for storage),
    like Go's `Quantity.Value()`.
    """

    __slots__ = ("_raw", "_value")

    def __init__(self, raw: str | int) -> None:
        if isinstance(raw, bool) or not isinstance(raw, str | int):
            raise QuantityError(
                f"invalid quantity {raw!r}: expected a string such as '10Gi' or an integer"
            )
        self._raw: str | int = raw
        self._value: Fraction = Fraction(raw) if isinstance(raw, int) else _parse(raw)

    @classmethod
    def from_value(cls, value: int | Fraction, *, binary: bool = True) -> Quantity:
        """A quantity for `value` in canonical form: the largest exact binary (`binary=True`,
        e.g. `2Gi`) or decimal (`2G`) suffix, else plain digits; fractions use m, u or n."""
        return cls(_format(Fraction(value), binary=binary))

    @property
    def value(self) -> Fraction:
        return self._value

    @property
    def raw(self) -> str | int:
        """The form this quantity was written in; what it serialises back to."""
        return self._raw

    def canonical(self, *, binary: bool = True) -> str:
        return _format(self._value, binary=binary)

    def __int__(self) -> int:
        return math.ceil(self._value)

    def _other(self, other: object) -> Fraction | None:
        if isinstance(other, Quantity):
            return other._value
        if isinstance(other, int) and not isinstance(other, bool):
            return Fraction(other)
        return None

    def __eq__(self, other: object) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self._value == value

    def __hash__(self) -> int:
        return hash(self._value)

    def __lt__(self, other: Quantity | int) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self._value < value

    def __le__(self, other: Quantity | int) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self._value <= value

    def __gt__(self, other: Quantity | int) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self._value > value

    def __ge__(self, other: Quantity | int) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self._value >= value

    def __add__(self, other: Quantity | int) -> Quantity:
        value = self._other(other)
        return NotImplemented if value is None else Quantity.from_value(self._value + value)

    __radd__ = __add__

    def __sub__(self, other: Quantity | int) -> Quantity:
        value = self._other(other)
        return NotImplemented if value is None else Quantity.from_value(self._value - value)

    def __str__(self) -> str:
        return str(self._raw)

    def __repr__(self) -> str:
        return f"Quantity({self._raw!r})"

    # ------------------------------------------------------------------------------ pydantic

    @classmethod
    def _validate(cls, value: Any) -> Quantity:
        return value if isinstance(value, Quantity) else cls(value)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda q: q.raw, return_schema=core_schema.any_schema()
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": CRD_PATTERN}]}
