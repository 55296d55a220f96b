"""HTTP side of the server: the JSON API, Prometheus metrics and the live dashboard page.

Build the ASGI app with :func:`create_app`; the server entry point serves it with uvicorn
on the same event loop as the gRPC server (``rpsagg-server --http-port``).
"""

from rpsagg_server.http.app import create_app
from rpsagg_server.http.metrics import ServerMetrics

__all__ = ["ServerMetrics", "create_app"]
