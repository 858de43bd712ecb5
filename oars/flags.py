"""Settings as command-line flags and `OARS_*` variables, for any tree of frozen dataclasses.

A field that the operator may set carries a `Flag` in its metadata (`setting(...)`): its flag,
its variable and its help. The parser is made from the fields and holds no default of its own;
reading takes a flag, else its variable, else the field's default. An empty variable counts as
unset, except for a list, where it is the empty list; a repeatable flag's variable
(comma-separated) adds to what the flags give. Fields without a flag are set only by code; a
field whose type is a dataclass is a group, walked in order.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

from oars.errors import SetupError

_T = TypeVar("_T")


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list, each name stripped, empty names left out."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


@dataclass(frozen=True)
class Flag:
    """How one setting is given: on the command line and in the environment."""

    name: str  # "--ctx"
    help: str
    env: str | None = None  # "CTX": read from OARS_CTX
    parse: Callable[[str], Any] = str  # a flag's argument or a variable's text → the value
    words: Mapping[str, Any] | None = None  # a closed set: each word and what it means
    repeat: bool = False  # given once per value (a tuple)
    switch: bool = False  # present or absent, no argument
    metavar: str | None = None

    @property
    def variable(self) -> str:
        return f"OARS_{self.env}" if self.env else ""

    def value(self, text: str) -> Any:
        """What a variable's text means (a flag's text is read by argparse, with `parse`)."""
        if self.words is not None:
            if text not in self.words:
                raise ValueError(f"expected one of {', '.join(self.words)}")
            return self.words[text]
        if self.repeat:
            return names(text)
        return self.parse(text)

    def shown(self, default: Any) -> str:
        """A default as it would be typed after the flag ('' where there is nothing to type)."""
        if self.words is not None:
            return next((word for word, v in self.words.items() if v == default), "")
        if default is None or self.switch or self.repeat:
            return ""
        if isinstance(default, tuple):
            return ",".join(default)
        if isinstance(default, float):
            return f"{default:g}"
        return str(default)


def setting(default: _T, name: str, help: str, **how: Any) -> _T:
    """A field with a default that `name` (and, if named, an `OARS_*` variable) may replace."""
    flag = Flag(name, help, **how)
    return field(default=default, metadata={"flag": flag})


def fields(cls: type[Any], prefix: str = "") -> Iterator[tuple[str, Flag, Any]]:
    """Every field of `cls` with a flag, groups walked in order: its dotted path, its flag and
    its default."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        if "flag" in f.metadata:
            yield path, f.metadata["flag"], f.default
        elif dataclasses.is_dataclass(hints[f.name]):
            yield from fields(hints[f.name], f"{path}.")


def add_flags(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """A flag per setting of `cls`, in a group per part (a field that is a dataclass)."""
    hints = get_type_hints(cls)
    for part in dataclasses.fields(cls):
        kind = hints[part.name]
        group = parser.add_argument_group(part.name, (kind.__doc__ or "").strip())
        for path, flag, default in fields(kind, f"{part.name}."):
            _add(group, path, flag, default)


def _add(group: argparse._ArgumentGroup, dest: str, flag: Flag, default: Any) -> None:
    shown = flag.shown(default)
    text = f"{flag.help} (default: {shown})" if shown else flag.help
    how: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS}
    if flag.switch:
        how["action"] = "store_true"
    elif flag.words is not None:
        how["choices"] = tuple(flag.words)
    else:  # named as argparse would from the flag: `--ctx CTX`
        how["type"] = flag.parse
        how["metavar"] = flag.metavar or flag.name.lstrip("-").upper().replace("-", "_")
    if flag.repeat:
        how["action"] = "append"
    group.add_argument(flag.name, help=text.replace("%", "%%"), **how)


def read(cls: type[_T], args: argparse.Namespace, environ: Mapping[str, str]) -> _T:
    """`cls` as given: the flags of `args` (parsed by `add_flags`'s parser), else the `OARS_*`
    variables of `environ`, else the fields' defaults."""
    given = vars(args)
    values: dict[str, Any] = {}
    for path, flag, default in fields(cls):
        try:
            values[path] = _value(flag, given.get(path), environ.get(flag.variable), default)
        except ValueError as exc:
            raise SetupError(f"{flag.variable}: {exc}") from exc
    return _build(cls, values)


def _value(flag: Flag, given: Any, variable: str | None, default: Any) -> Any:
    if variable == "" and not (flag.repeat or flag.parse is names):
        variable = None  # an empty variable is unset, unless it is a list (then empty)
    if flag.repeat:
        if given is None and variable is None:
            return default
        return tuple(given or ()) + (flag.value(variable) if variable else ())
    if given is not None:
        return flag.words[given] if flag.words is not None else given
    return default if variable is None else flag.value(variable)


def _build(cls: type[_T], values: Mapping[str, Any], prefix: str = "") -> _T:
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        path = f"{prefix}{f.name}"
        if path in values:
            kwargs[f.name] = values[path]
        elif dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], values, f"{path}.")
    return cls(**kwargs)


def rows(cls: type[Any]) -> Iterator[tuple[str, str, str, str]]:
    """The flags of `cls` for a table: the flag, its variable ('' if none), its default as
    typed ('' if none) and its help."""
    for _, flag, default in fields(cls):
        yield flag.name, flag.variable, flag.shown(default), flag.help
