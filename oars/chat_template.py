"""Rendering a model's own chat template, which is untrusted input: a sandboxed Jinja environment."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from oars.errors import InvalidRequest


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    # Jinja's own tojson escapes <, >, & for HTML; prompts must carry them as they are.
    return json.dumps(value, ensure_ascii=False, indent=indent)


class ChatTemplate:
    """A compiled chat template. `render` raises `InvalidRequest` when the template rejects input."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.source = source
        self._template = env.from_string(source)
        self._tokens = {"bos_token": bos_token, "eos_token": eos_token}

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] = (),
        **kwargs: Any,
    ) -> str:
        try:
            return self._template.render(
                messages=list(messages),
                tools=list(tools) or None,
                add_generation_prompt=True,
                **self._tokens,
                **kwargs,
            )
        except (TemplateError, TypeError, ValueError) as exc:
            raise InvalidRequest(
                f"The model's chat template rejected the input: {exc}", param="input"
            ) from exc
