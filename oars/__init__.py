"""oars: an OpenAI Responses API server for open-weight models."""

__version__ = "0.1.0"
