"""The response state machine."""

from oars.events.builder import Event, ResponseBuilder, new_id

__all__ = ["Event", "ResponseBuilder", "new_id"]
