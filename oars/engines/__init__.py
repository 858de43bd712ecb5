"""Engines: where tokens come from. One module per backend."""

from oars.engines.base import Engine, ModelInfo, Opened

__all__ = ["Engine", "ModelInfo", "Opened"]
