"""Engines: where tokens come from. One module per backend."""

from oars.engines.base import Engine, ModelInfo, Prepared

__all__ = ["Engine", "ModelInfo", "Prepared"]
