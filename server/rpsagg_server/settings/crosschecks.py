"""The checks between settings: what one field asks of another (the scheme of ``--bits``,
``--k`` within d, target mode's k range, the data of a task, TLS with tokens, a decode
backend's scheme). Each field's own rule is in :mod:`rpsagg_server.settings.jobspec` and
:mod:`rpsagg_server.settings.process`; :class:`~rpsagg_server.settings.serverconfig.ServerConfig`
runs these after them, in this order, and the first that fails is its one-line message.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING

from rpsagg.schemes import names_where, scheme_traits, transform_option
from rpsagg.tasks import EXTERNAL_DATA
from rpsagg_server.settings.jobspec import PROJECTION_SCHEMES
from rpsagg_server.settings.rules import AUTO

if TYPE_CHECKING:
    from rpsagg_server.settings.serverconfig import ServerConfig

QUANTIZABLE = names_where(lambda t: t.quantizable)
BITS_SCHEMES = " and ".join(names_where(lambda t: t.takes_bits))


def check_scheme(c: ServerConfig) -> None:
    """``--value-bits`` and ``--bits``: each for the schemes that take it."""
    traits = scheme_traits(c.estimator)
    if c.value_bits != 32 and not traits.quantizable:
        raise ValueError(f"--value-bits applies to {', '.join(QUANTIZABLE)}; "
                         f"use --bits for {BITS_SCHEMES}")
    if c.value_bits == AUTO and not c.target_rel_error > 0:
        raise ValueError("--value-bits auto chooses each round's value width for "
                         "--target-rel-error: pass it too")
    if traits.takes_bits:
        from rpsagg import make_estimator

        if c.bits == 0:
            raise ValueError(f"--estimator {c.estimator} needs --bits")
        make_estimator(c.estimator, n=c.n, d=max(c.d, 1), bits=c.bits)
    elif c.bits != 0:
        raise ValueError(f"--bits applies to {BITS_SCHEMES}; use --value-bits for "
                         f"{c.estimator}")


def check_block_size(c: ServerConfig) -> None:
    """``--block-size``: Rand-Proj-Spatial only, a known d, at most d, and at least one value
    per block (k, and with --target-rel-error the least k, >= ceil(d / block size): an
    explicit --k-min, else --k-max, since --k-min's default is the blocks)."""
    if c.block_size == 0:
        return
    if not scheme_traits(c.estimator).takes_projection:
        raise ValueError(f"--block-size applies to --estimator {PROJECTION_SCHEMES}")
    if c.d == 0:
        raise ValueError("--block-size needs --d (a job whose d comes from the first "
                         "join runs one transform over all of d)")
    size, blocks = c.block_size_for(c.d), c.blocks
    if size > c.d:
        raise ValueError(f"--block-size {size} is above d = {c.d} (use 0: one "
                         "transform over all of d)")
    if blocks:
        least, flag = c.k, "--k"
        if c.target_rel_error > 0 and c.k_min is not None:
            least, flag = c.k_min, "--k-min"
        elif c.target_rel_error > 0:  # --k-min is the blocks: --k-max must reach it
            least, flag = c.k_max or c.k, "--k-max" if c.k_max else "--k"
        if least < blocks:
            raise ValueError(f"{flag} must be >= the number of blocks ceil(d / block "
                             f"size) = {blocks} with --block-size {size}; got {least}")


def check_transform(c: ServerConfig) -> None:
    """``--transform``: a name, or a number R in [0, n-1] (what the estimator reads)."""
    if not scheme_traits(c.estimator).takes_transform:
        return
    try:
        transform_option(c.transform, c.n)
    except ValueError as exc:
        raise ValueError(f"--{exc}") from None


def check_dimensions(c: ServerConfig) -> None:
    """``--d`` (0 only with external data) within ``--max-d``, ``--k`` within d."""
    if c.d == 0 and c.data != EXTERNAL_DATA:
        raise ValueError("--d 0 (d from the first client's join) goes with --data "
                         f"{EXTERNAL_DATA}")
    if c.d > c.d_limit:
        raise ValueError(f"--d {c.d} is above --max-d {c.d_limit} (the largest d "
                         "this server may allocate for; raise --max-d for more)")
    if not scheme_traits(c.estimator).takes_k:
        return  # eden, qsgd send every coordinate: --k is ignored (RoundInfo.k is 0)
    if c.d and not 1 <= c.k <= c.d:
        raise ValueError(f"--k must be in [1, d] = [1, {c.d}]; got {c.k}")
    if c.k < 1:
        raise ValueError(f"--k must be >= 1; got {c.k}")


def check_target(c: ServerConfig) -> None:
    """Target mode: a scheme whose error depends on R alone, and a k range within d."""
    traits = scheme_traits(c.estimator)
    if not c.target_rel_error > 0:
        if c.k_max or c.k_min not in (None, 1):  # 1: the default it once had
            raise ValueError("--k-min and --k-max go with --target-rel-error")
        return
    if not traits.takes_k:
        raise ValueError(f"--target-rel-error chooses k: --estimator {c.estimator} takes no k")
    if traits.sends_indices:
        raise ValueError(f"--target-rel-error needs a predicted error that depends on R "
                         f"alone; --estimator {c.estimator}'s depends on the vectors' shape")
    top = c.k_max or c.k
    if c.k_min is not None and not 1 <= c.k_min <= top:
        raise ValueError(f"--k-min must be in [1, k-max] = [1, {top}]; got {c.k_min}")
    if c.d and top > c.d:
        raise ValueError(f"--k-max must be <= d = {c.d}; got {top}")


def check_task(c: ServerConfig) -> None:
    """The clients, the data and the task's parameters go together."""
    if not 1 <= c.min_clients <= c.n:
        raise ValueError(f"--min-clients must be in [1, n]; got {c.min_clients}")
    if c.data == EXTERNAL_DATA and c.task != "mean":
        raise ValueError(f"--data {EXTERNAL_DATA} (the clients' own vectors) goes with "
                         f"--task mean; got --task {c.task}")
    if c.data == "synthetic" and not 0 <= c.data_r <= c.n - 1:
        raise ValueError(f"--data-r must be in [0, n-1] = [0, {c.n - 1}] for synthetic "
                         f"data (the clients' generator refuses others); got {c.data_r}")
    if c.mean_vectors != 1 and c.task != "mean":
        raise ValueError("--mean-vectors applies to --task mean")


def check_security(c: ServerConfig) -> None:
    """TLS and tokens unless ``--insecure``; certificates and keys in pairs."""
    if c.http_tls and not c.tls_cert:
        raise ValueError("--http-tls serves the dashboard with --tls-cert and --tls-key: "
                         "pass them too")
    if not c.insecure:
        if not (c.tls_cert and c.tls_key):
            raise ValueError("TLS is required: pass --tls-cert and --tls-key (or --insecure, "
                             "explicitly, to run without TLS and tokens)")
        if not c.tokens:
            raise ValueError("--tokens FILE is required unless --insecure is given")
    if bool(c.tls_cert) != bool(c.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    if c.tls_client_ca and not c.tls_cert:
        raise ValueError("--tls-client-ca (mTLS) needs --tls-cert and --tls-key")


def check_decoding(c: ServerConfig) -> None:
    """A decode device or Ray for the projection schemes, with what they need installed;
    uvloop installed when asked for."""
    takes_projection = scheme_traits(c.estimator).takes_projection
    if c.decode_device is not None:
        if not takes_projection:
            raise ValueError(f"--decode-device applies to --estimator {PROJECTION_SCHEMES}")
        try:
            from rpsagg.device import resolve_device
        except ImportError as exc:  # pragma: no cover - the test set-up installs torch
            raise ValueError(f"--decode-device needs PyTorch: {exc}") from exc
        resolve_device(c.decode_device)  # fails now, not at the first round
    if c.decode_backend == "ray":
        if not takes_projection:
            raise ValueError(f"--decode-backend ray applies to --estimator {PROJECTION_SCHEMES}")
        # found without importing it: Ray reads its environment when imported, and
        # rpsagg_server.decode.raydecode sets that environment first
        if importlib.util.find_spec("ray") is None:  # pragma: no cover - tests install it
            raise ValueError("--decode-backend ray needs Ray: pip install 'rpsagg-server[ray]'")
    elif c.ray_address is not None:
        raise ValueError("--ray-address goes with --decode-backend ray")
    if c.event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise ValueError("--event-loop uvloop needs uvloop: pip install uvloop")


#: every check, in the order they run
CHECKS: tuple[Callable[[ServerConfig], None], ...] = (
    check_scheme, check_block_size, check_transform, check_dimensions, check_target,
    check_task, check_security, check_decoding)
