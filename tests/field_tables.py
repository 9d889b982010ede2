"""The light readings of settings (a Lambda function's, runtimes/function/environment.py; `sandlot serve`'s early
one, handler/early_settings.py) declare each field as (kind, default, bounds): check one table against the
pydantic model it stands in for, field by field."""

from __future__ import annotations

import typing

import annotated_types


def assert_declares_what_the_model_declares(fields: dict, model_fields: dict, plain_kinds: bool = True) -> None:
    """Every field of the table has the model's default, bounds and choices (lists: "list" for a list of strings,
    else "model"); plain_kinds: every other kind is the annotation's type name."""
    for name, (kind, default, bounds) in fields.items():
        info = model_fields[name]
        if info.default_factory is not None:
            assert callable(default) and default() == info.default_factory(), name
        else:
            assert default == info.default and type(default) is type(info.default), name
        declared = {}
        for constraint in info.metadata:
            for bound in ("gt", "ge", "le", "lt"):
                if isinstance(constraint, getattr(annotated_types, bound.capitalize())):
                    declared[bound] = getattr(constraint, bound)
        assert bounds == declared, name
        if typing.get_origin(info.annotation) is typing.Literal:
            assert kind == typing.get_args(info.annotation), name
        elif typing.get_origin(info.annotation) is list:
            assert kind in ("list", "model") and (kind == "list") == (typing.get_args(info.annotation) == (str,))
        elif plain_kinds:
            assert kind == info.annotation.__name__, name
