"""The base of the pydantic models that describe rule and config files (collectors/rule_loader.py
validates every file against one): unknown keys are refused and values are not coerced (`"31"` is no
integer, `1` is no `true`), as in the file's own schema. A number is an integer or a float, never a
boolean."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = ["FileModel", "FormatVersion1", "Fraction", "NonNegative", "NonNegativeInt", "Text"]


class FileModel(BaseModel):
    """A section of a rule file: unknown keys refused, no coercion, frozen."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# a float field takes an int too under strict=True, never a bool
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Text = Annotated[str, Field(min_length=1)]  # a non-empty string



def _version_1(value: int) -> int:
    if value != 1:
        raise ValueError("1")  # the loader's shape: `format_version: expected 1, got 2`
    return value


FormatVersion1 = Annotated[int, AfterValidator(_version_1)]
