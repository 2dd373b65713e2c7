"""Mayfly: durable workflows as a plain Python library."""

from mayfly.model.errors import *  # noqa: F403  # the error hierarchy is public API
from mayfly.model.ids import *  # noqa: F403  # identities are public API
