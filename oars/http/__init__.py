"""The only package that imports the web framework."""

from oars.http.app import create_app

__all__ = ["create_app"]
