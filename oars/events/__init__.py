"""The response state machine."""

from oars.events.builder import Event, ResponseBuilder
from oars.ids import new_id

__all__ = ["Event", "ResponseBuilder", "new_id"]
