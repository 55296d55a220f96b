"""What ``rpsagg-client`` prints for a round: the line of a finished round, the error the
server estimated, the bytes a submission takes on the wire.

Pure functions of the messages (:mod:`rpsagg_wire.v1.messages`); nothing here talks to the
server.
"""

from __future__ import annotations

import math

from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.messages import RoundState
from rpsagg_wire.v1.serde import RoundResult, Submission


def fmt_bytes(b: float) -> str:
    """``123 B``, ``4.1 KiB``, ``2.0 MiB``."""
    for unit in ("B", "KiB", "MiB"):
        if b < 1024 or unit == "MiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GiB"


def wire_bytes(sub: Submission) -> int:
    """Bytes of the Submit request less the evaluation references (the server's count)."""
    return serde.decode_submission(serde.encode_submission(sub)).wire_bytes


def round_line(client_id: str, round_id: int, sent: Submission | None, note: str,
               res: RoundResult | None, n: int, job: str = "") -> str:
    """The line printed for a finished round (see the module docstring).

    Parameters
    ----------
    client_id : str
        This client's id; the line starts with ``[client_id]``.
    round_id : int
        The round.
    sent : Submission or None
        What this client sent in the round (None: nothing; ``note`` says why).
    note : str
        How the submission went (``acked as 3 of 10``), or why nothing was sent.
    res : RoundResult or None
        The round's result, if known.
    n : int
        The job's number of clients.
    job : str, optional
        The job's id (``--job``): the line says ``[client_id] job ID round N:``.

    Returns
    -------
    str
    """
    head = f"[{client_id}] {f'job {job} ' if job else ''}round {round_id}:"
    if sent is None:
        body = f"nothing sent ({note})"
    else:
        coded = [v for v in sent.vectors if v.codes is not None]
        if coded:
            what = f"{sum(v.count for v in coded)} {coded[0].value_bits}-bit values + scale + seed"
        else:
            what = f"{sum(v.values.size for v in sent.vectors)} floats + seed"
        body = f"sent {fmt_bytes(wire_bytes(sent))} ({what}), {note}"
    if res is None:
        return f"{head} {body}"
    if res.state == RoundState.DONE:
        end = f"round done with {res.n_prime}/{n} clients{estimated_error_text(res)}"
    elif res.state == RoundState.FAILED:
        end = f"round failed: {res.reason}"
    else:
        end = f"round {res.state}"
    return f"{head} {body}; {end}"


def estimated_error_text(res: RoundResult) -> str:
    """``", estimated relative error 0.0123 +- 0.0004"`` for a result that carries the
    server's estimate (its squared error where the relative one is not defined); empty
    for one that does not (a server that does not send it)."""
    rel, sq = res.est_relative_error, res.est_sq_error
    if math.isfinite(rel):
        mean = res.est_mean_sq_norm
        err = res.est_sq_error_stderr / mean if mean > 0 else math.nan
        return f", estimated relative error {rel:.4g}{_pm(err)}"
    if math.isfinite(sq):
        return f", estimated squared error {sq:.4g}{_pm(res.est_sq_error_stderr)}"
    return ""


def _pm(stderr: float) -> str:
    return f" +- {stderr:.2g}" if math.isfinite(stderr) else ""
