"""The response state machine."""

from oars.events.builder import CallTarget, Event, ResponseBuilder
from oars.ids import new_id

__all__ = ["CallTarget", "Event", "ResponseBuilder", "new_id"]
