"""Request dependencies shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from rpsagg_server.readmodel.state import ServerState


def get_state(request: Request) -> ServerState:
    """The :class:`ServerState` the app was built for."""
    state: ServerState = request.app.state.server_state
    return state


StateDep = Annotated[ServerState, Depends(get_state)]
