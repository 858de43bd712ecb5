"""`oars serve`'s settings: every flag has one default (its field's), and a flag, its `OARS_*`
variable and the field's default take turns in that order."""

from __future__ import annotations

import argparse
import dataclasses
from functools import reduce
from typing import Any

import pytest

from oars.errors import SetupError
from oars.flags import Flag, fields
from oars.settings import Settings, add_flags, days, flag_rows, from_args

FLAGS = list(fields(Settings))


def _parse(argv: list[str], environ: dict[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return from_args(parser.parse_args(argv), environ or {})


def _get(settings: Settings, path: str) -> Any:
    return reduce(getattr, path.split("."), settings)


def _sample(flag: Flag, default: Any) -> tuple[str, Any]:
    """A text for the flag other than its default, and what it means."""
    if flag.words is not None:
        word = next(w for w, v in flag.words.items() if v != default)
        return word, flag.words[word]
    if flag.repeat:
        return "x", ("x",)
    samples: dict[Any, str] = {int: "7", float: "0.5", days: "30"}
    text = samples.get(flag.parse, "health")
    return text, flag.parse(text)


def _others_default(settings: Settings, path: str) -> None:
    for other, _, default in FLAGS:
        if other != path:
            assert _get(settings, other) == default, (path, other)


def test_no_flag_and_no_variable_is_every_field_s_default() -> None:
    assert _parse([]) == Settings()


def test_the_parser_holds_no_default_of_its_own() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    actions = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert len(actions) == len(FLAGS)
    assert all(a.default is argparse.SUPPRESS for a in actions)


@pytest.mark.parametrize(("path", "flag", "default"), FLAGS, ids=[f.name for _, f, _ in FLAGS])
def test_a_flag_sets_its_field(path: str, flag: Flag, default: Any) -> None:
    if flag.switch:
        settings = _parse([flag.name])
        assert _get(settings, path) is True
    else:
        text, value = _sample(flag, default)
        settings = _parse([flag.name, text])
        assert value != default and _get(settings, path) == value
    _others_default(settings, path)


ENV = [(p, f, d) for p, f, d in FLAGS if f.env]


@pytest.mark.parametrize(("path", "flag", "default"), ENV, ids=[f.variable for _, f, _ in ENV])
def test_a_variable_sets_its_field_and_a_flag_beats_it(path: str, flag: Flag, default: Any) -> None:
    text, value = _sample(flag, default)
    settings = _parse([], {flag.variable: text})
    assert _get(settings, path) == value
    _others_default(settings, path)
    if not flag.repeat:  # a repeatable flag's variable adds to it instead
        assert _get(_parse([flag.name, text], {flag.variable: "1"}), path) == value


def test_api_keys_come_from_flags_then_the_variable() -> None:
    settings = _parse(["--api-key", "k1", "--api-key", "k2"], {"OARS_API_KEYS": "k3, k4,"})
    assert settings.server.api_keys == ("k1", "k2", "k3", "k4")


def test_an_empty_variable_is_unset_but_an_empty_list_is_empty() -> None:
    settings = _parse([], {"OARS_PORT": "", "OARS_MODEL": "", "OARS_QUEUE_DEPTH": ""})
    assert settings == Settings()
    assert _parse([], {"OARS_PUBLIC": ""}).server.public == ()
    assert _parse(["--public", ""]).server.public == ()


def test_a_variable_that_means_nothing_is_a_setup_error() -> None:
    with pytest.raises(SetupError, match="OARS_SMALL_MODEL_GUARDS"):
        _parse([], {"OARS_SMALL_MODEL_GUARDS": "maybe"})
    with pytest.raises(SetupError, match="OARS_PORT"):
        _parse([], {"OARS_PORT": "eighty"})


def test_switches_and_zero_keep_their_meaning() -> None:
    assert _parse(["--small-model-guards", "auto"]).engine.small_model_guards is None
    assert _parse(["--flash-attn", "off"]).engine.flash_attn is False
    assert _parse(["--request-timeout", "0"]).server.limits.request_timeout == 0.0
    assert _parse(["--prefix-cache-mb", "0"]).engine.prefix_cache_bytes == 0


def test_the_flag_table_has_a_row_per_flag_with_the_field_s_default() -> None:
    rows = {flag: (env, default, text) for flag, env, default, text in flag_rows()}
    assert len(rows) == len(FLAGS)
    assert rows["--ctx"] == ("OARS_CTX", "16384", rows["--ctx"][2])
    assert rows["--public"][:2] == ("OARS_PUBLIC", "health,metrics")
    assert rows["--small-model-guards"][1] == "auto"
    assert rows["--request-timeout"][1] == "1800"
    assert rows["--api-key"][:2] == ("OARS_API_KEYS", "")
    assert all(text for _, _, text in rows.values())


def test_settings_are_values() -> None:
    settings = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.server.port = 1  # type: ignore[misc]
