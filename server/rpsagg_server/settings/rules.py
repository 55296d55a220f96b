"""One field's rule: what a setting's value must be, and the one line that says so.

The settings models (:mod:`rpsagg_server.settings.jobspec`, :mod:`rpsagg_server.settings.process`)
check every field with :func:`check_field` (through :func:`validate_field`): first the range
its value reaches (:func:`rpsagg_server.settings.bounds.check_range`), then the field's own
:class:`Rule`, then that a number is finite
(:func:`rpsagg_server.settings.bounds.check_finite`). Messages name the flag
(``--round-timeout``); the jobs API renames them to the job setting (``round_timeout``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationInfo
from pydantic.fields import FieldInfo

from rpsagg_server.settings.bounds import check_finite, check_range

#: the value a setting may have where a number or ``auto`` is taken
AUTO: Final = "auto"
#: the validation context's key for the fields whose values were checked already (a job's
#: copy of the server's own settings): their rules do not run again
CHECKED: Final = "checked"


def field_infos(model: type) -> dict[str, FieldInfo]:
    """The fields of a pydantic dataclass, in their order (name, type, default,
    description and metadata of each)."""
    infos: dict[str, FieldInfo] = vars(model)["__pydantic_fields__"]
    return infos


@dataclass(frozen=True)
class Rule:
    """A value check and its message.

    Parameters
    ----------
    ok : callable
        True for a value the field takes.
    text : str
        What the value must be (``must be >= 1``), after the flag's name.
    show : callable or None
        How the refused value is shown after ``; got`` (``repr`` for text); None shows
        nothing.
    """

    ok: Callable[[Any], bool]
    text: str
    show: Callable[[Any], str] | None = str


def at_least(low: float, note: str = "") -> Rule:
    """``value >= low`` (``note``: what the least value means, e.g. ``0: automatic``)."""
    return Rule(lambda v: v >= low, f"must be >= {low:g}" + (f" ({note})" if note else ""))


def finite(low: float, strict: bool = False, note: str = "") -> Rule:
    """A finite number ``> low`` (``strict``) or ``>= low``."""
    return Rule(lambda v: math.isfinite(v) and (v > low if strict else v >= low),
                f"must be a finite number {'>' if strict else '>='} {low:g}"
                + (f" ({note})" if note else ""))


def one_of(choices: tuple[str, ...], show: bool = True) -> Rule:
    """One of ``choices`` (listed in the message)."""
    text = ("must be one of " + ", ".join(choices) if len(choices) > 2
            else "must be " + " or ".join(choices))
    return Rule(lambda v: v in choices, text, repr if show else None)


def validate_field(rules: Mapping[str, Rule], value: Any, info: ValidationInfo) -> Any:
    """The settings models' field validator: :func:`check_field`, unless the validation's
    context lists the field as :data:`CHECKED`."""
    context = info.context
    name = str(info.field_name)
    if context is not None and name in context.get(CHECKED, ()):
        return value
    return check_field(rules, name, value)


def check_field(rules: Mapping[str, Rule], name: str, value: Any) -> Any:
    """Check ``value`` of field ``name``: its range, its rule in ``rules`` (when it has one and
    the value is set), and that it is finite; return it unchanged.

    Raises
    ------
    ValueError
        One line naming the flag.
    """
    check_range(name, value)
    rule = rules.get(name)
    if rule is not None and value is not None and value != AUTO and not rule.ok(value):
        got = "" if rule.show is None else f"; got {rule.show(value)}"
        raise ValueError(f"--{name.replace('_', '-')} {rule.text}{got}")
    check_finite(name, value)
    return value
