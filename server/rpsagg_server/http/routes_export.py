"""Downloads of every round: ``GET /api/rounds/export.csv`` and ``/api/rounds/export.json``.

Registered before ``/api/rounds/{round_id}`` (whose path would otherwise match them).

CSV injection (OWASP "CSV Injection"): a spreadsheet runs a cell that starts with ``=``,
``+``, ``-``, ``@``, a tab or a carriage return as a formula, and client ids are chosen by
the clients. Every text cell that starts with one of those gets a leading ``'`` (shown as
text, the quote hidden). Numbers are written as numbers, negative ones included: a cell
that is a number is never a formula, and ``'-0.5`` would no longer sum.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from fastapi import APIRouter, Response

from rpsagg_server.http import schemas
from rpsagg_server.http.deps import StateDep

router = APIRouter(prefix="/api/rounds", tags=["rounds"])

CSV_COLUMNS = (
    "round_id", "state", "reason", "scheme", "transform", "task_step", "opened",
    "first_submission", "closed", "finished", "clients_expected", "clients_arrived",
    "clients_missing", "bytes_wire", "bytes_payload", "bytes_raw_float32", "decode_seconds",
    "beta", "c", "r_hat", "r_prior", "sq_error", "sq_error_rand_k", "sq_error_rand_k_spatial",
    "truth_sq_norm", "relative_error", "relative_error_rand_k",
    "relative_error_rand_k_spatial", "task_metric", "task_metric_value",
    "eigenvector_distance", "est_sq_error", "est_sq_error_stderr", "est_mean_sq_norm",
    "est_relative_error", "est_relative_error_stderr",
)


def _rounds(state: StateDep) -> list[schemas.Round]:
    return [schemas.from_round(v, state.task_metrics(v.round_id))
            for v in reversed(state.rounds())]


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: object) -> object:
    """``value`` for a CSV cell: text starting like a formula gets a leading ``'``;
    numbers (``int``, ``float``), ``None`` and other text are returned unchanged."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_row(r: schemas.Round) -> dict[str, Any]:
    """One round as the CSV's flat columns (empty cells for nulls)."""
    se, rel, tp, est = r.squared_error, r.relative_error, r.task_progress, r.error_estimate
    ts = r.timestamps
    return {
        "round_id": r.round_id, "state": r.state, "reason": r.reason, "scheme": r.scheme,
        "transform": r.transform, "task_step": r.task_step, "opened": ts.opened,
        "first_submission": ts.first_submission, "closed": ts.closed,
        "finished": ts.finished, "clients_expected": r.clients.expected,
        "clients_arrived": " ".join(r.clients.arrived),
        "clients_missing": " ".join(r.clients.missing), "bytes_wire": r.bytes.wire,
        "bytes_payload": r.bytes.payload, "bytes_raw_float32": r.bytes.raw_float32,
        "decode_seconds": r.decode_seconds, "beta": r.beta, "c": r.c, "r_hat": r.r_hat,
        "r_prior": r.r_prior,
        "sq_error": se and se.estimate, "sq_error_rand_k": se and se.rand_k,
        "sq_error_rand_k_spatial": se and se.rand_k_spatial,
        "truth_sq_norm": se and se.truth_sq_norm,
        "relative_error": rel and rel.estimate, "relative_error_rand_k": rel and rel.rand_k,
        "relative_error_rand_k_spatial": rel and rel.rand_k_spatial,
        "task_metric": tp and tp.name, "task_metric_value": tp and tp.value,
        "eigenvector_distance": tp and tp.eigenvector_distance,
        "est_sq_error": est and est.squared_error,
        "est_sq_error_stderr": est and est.squared_error_stderr,
        "est_mean_sq_norm": est and est.mean_norm_squared,
        "est_relative_error": est and est.relative_error,
        "est_relative_error_stderr": est and est.relative_error_stderr,
    }


@router.get("/export.csv", summary="Every round as CSV (download)",
            response_class=Response,
            responses={200: {"content": {"text/csv": {}}, "description": "One row per round"}})
def export_csv(state: StateDep) -> Response:
    """Every round, oldest first, one row each (flat columns; empty cells for nulls;
    client ids separated by spaces); ``repr`` precision for floats. Text cells starting
    with ``=``, ``+``, ``-``, ``@``, tab or CR get a leading ``'`` (CSV injection)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in _rounds(state):
        writer.writerow({k: ("" if v is None else spreadsheet_safe(v))
                         for k, v in csv_row(r).items()})
    return Response(buf.getvalue(), media_type="text/csv; charset=utf-8", headers={
        "Content-Disposition": 'attachment; filename="rpsagg-rounds.csv"'})


@router.get("/export.json", summary="Every round as JSON (download)",
            response_model=list[schemas.Round])
def export_json(state: StateDep, response: Response) -> list[schemas.Round]:
    """Every round, oldest first, each as ``GET /api/rounds/{id}`` returns it."""
    response.headers["Content-Disposition"] = 'attachment; filename="rpsagg-rounds.json"'
    return _rounds(state)
