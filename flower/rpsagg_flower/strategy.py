"""The server side: FedAvg whose model updates arrive compressed and are decoded jointly."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from rpsagg import (
    CorrelationTracker,
    Estimator,
)
from rpsagg.planning import BudgetPolicy
from rpsagg.schemes import DEFAULT_ESTIMATOR, scheme_traits
from rpsagg_flower.compression import CompressionConfig, layer_budgets
from rpsagg_flower.dpcheck import DriverCheck
from rpsagg_flower.optim import ServerOptimizer, ServerSGD
from rpsagg_flower.payload import (
    Layout,
    apply_update,
    mean_plain,
)
from rpsagg_flower.rounds import RoundPlan, accept, byte_metrics, decode, decode_metrics
from rpsagg_flower.settings import AUTO_BLOCK_SIZE, AUTO_BLOCK_THRESHOLD, RoundEncoding

log = logging.getLogger("flwr.rpsagg_flower")  # through Flower's log handlers


class RandProjSpatialFedAvg(FedAvg):
    """FedAvg with compressed model updates (clients use ``rpsagg_flower.rpsagg_mod``).

    Each training round the strategy sends the estimator's settings and a fresh 64-bit
    nonce in the round's config. Clients reply with the estimator's message of their update
    (the difference to the arrays they received, flattened across the ``ArrayRecord``,
    times their ``weighted_by_key`` metric when ``weighted``); the strategy decodes the
    ``n'`` replies that arrived jointly (beta and the transform for ``n'``), adds the mean
    update to the global arrays (each in its own shape and dtype) and reports, next to the
    clients' aggregated metrics:

    ``rpsagg.n-prime``, ``rpsagg.bytes-up`` (those replies as Flower sends them:
    ``rpsagg_flower.wire.wire_bytes`` of each ``Message``, its metadata and every
    object of its content), ``rpsagg.payload-bytes-up`` (their compressed records' data and
    keys alone, as Flower's ``count_bytes`` counts them), ``rpsagg.bytes-up-uncompressed``
    (the same replies' wire bytes with the model's arrays, as FedAvg's replies would
    travel), ``rpsagg.compression-ratio`` (the last over the first),
    ``rpsagg.payload-bytes`` (seeds, values or codes, indices: the estimator's own count),
    ``rpsagg.beta``, ``rpsagg.decode-seconds`` and, where the sketches allow it,
    ``rpsagg.r-hat``: the estimated correlation R of the round's updates.

    Parameters
    ----------
    compression : CompressionConfig or str, optional
        What to compress and how (:class:`~rpsagg_flower.compression.CompressionConfig`),
        or its estimator's name (default: Rand-Proj-Spatial), the config's other fields then
        given as keywords here (``estimator=`` too).
    server_optimizer : ServerOptimizer, optional
        Applies the decoded mean update as a pseudo-gradient
        (``rpsagg_flower.optim``: ``ServerSGD(lr, momentum)`` for a server learning rate
        and FedAvgM, ``ServerAdam``, ``ServerYogi``, ``ServerAdagrad``). Default: a step of
        1, as FedAvg.
    nonces : callable, optional
        Draws each round's 64-bit nonce (default ``secrets.randbits(64)``).
    **options
        FedAvg's own parameters (``fraction_train``, ``min_train_nodes``,
        ``weighted_by_key``, ``arrayrecord_key``, ...), passed to FedAvg as they are; with
        an estimator's name, also the fields of ``CompressionConfig`` (``k=``, ...).

    Raises
    ------
    ValueError
        A ``CompressionConfig`` that does not fit (its own checks);
        ``error_feedback`` with a server optimizer other than a ``ServerSGD`` without
        momentum.
    TypeError
        Compression keywords beside a whole ``CompressionConfig``.

    Examples
    --------
    >>> from rpsagg_flower import CompressionConfig, RandProjSpatialFedAvg, ServerSGD
    >>> strategy = RandProjSpatialFedAvg(
    ...     CompressionConfig("rand-proj-spatial", k=250), server_optimizer=ServerSGD(lr=0.5),
    ...     min_train_nodes=10, min_available_nodes=10)
    >>> same = RandProjSpatialFedAvg("rand-proj-spatial", k=250, min_train_nodes=10)
    """

    def __init__(
        self,
        compression: CompressionConfig | str | None = None,
        *,
        server_optimizer: ServerOptimizer | None = None,
        nonces: Callable[[], int] | None = None,
        **options: Any,
    ) -> None:
        ours, fedavg = CompressionConfig.split(options)
        if isinstance(compression, CompressionConfig):
            if ours:
                raise TypeError(f"give the compression as a CompressionConfig or as keywords, "
                                f"not both: {', '.join(sorted(ours))}")
            config = compression
        else:
            if compression is not None and "estimator" in ours:
                raise TypeError("the estimator is given twice: as the first argument and as "
                                "estimator=")
            ours.setdefault("estimator", compression or DEFAULT_ESTIMATOR)
            config = CompressionConfig(**ours)
        super().__init__(**fedavg)
        optimizer = server_optimizer or ServerSGD()
        if config.error_feedback and not (isinstance(optimizer, ServerSGD)
                                          and optimizer.momentum == 0.0):
            raise ValueError("error_feedback needs a plain server step (ServerSGD without "
                             f"momentum); got {optimizer.describe()}")
        #: the compression as constructed (the attributes below may be changed between
        #: rounds, e.g. ``k``)
        self.compression = config
        self.estimator_name = config.estimator
        self.k = config.k
        self.transform = config.transform
        self.value_bits = config.value_bits
        self.bits = config.bits
        self.block_size = config.block_size
        self.projection = config.projection
        self.weighted = config.weighted
        self.uncompressed = config.uncompressed
        self.missing_payload = config.missing_payload
        self.error_feedback = config.error_feedback
        self.solver = config.solver
        self.error_tol: float | str | None = config.error_tol
        self.per_layer = config.per_layer
        self.target_rel_error = config.target_rel_error
        self.k_min = config.k_min
        self.frozen = config.frozen
        self.partial = config.partial
        self.server_optimizer = optimizer
        self._nonces = nonces or (lambda: secrets.randbits(64))
        self.tracker = CorrelationTracker(alpha=config.correlation_alpha)
        self._last_n: int | None = None  # replies decoded in the last round
        self._round_k: int | None = None
        self._plan: RoundPlan | None = None
        self._check = DriverCheck()

    def start(self, *args: Any, **kwargs: Any) -> Result:
        """Flower's ``Strategy.start`` (the same arguments), inside :meth:`driving`."""
        with self.driving():
            return super().start(*args, **kwargs)

    def driving(self) -> AbstractContextManager[None]:
        """Declare that the code inside drives this strategy itself, without a wrapper.

        A strategy run by its own ``start()`` is driven so. Under any other driver (a
        strategy wrapper, a loop of your own) a round whose config has no clipping norm asks
        the clients for a check record (``rpsagg_flower.dpcheck``) until one comes back:
        Flower's server-side clipping wrappers, which cannot wrap this strategy, fail on it
        with a ``TypeError`` naming the client-side clipping to use.

        Returns
        -------
        context manager
            ``with strategy.driving(): strategy.configure_train(...)``.
        """
        return self._check.driving()

    def summary(self) -> None:
        """Log the configuration (FedAvg's, then the compression) as constructed.

        ``k`` there is the constructor's (the upper bound under ``target_rel_error``); each
        round's k is its metric ``rpsagg.k``. ``Strategy.start`` calls it before round 1.
        """
        super().summary()
        log.info(
            "\t└──> rpsagg: %s, k=%s (each round's: metric rpsagg.k), transform=%s, "
            "value_bits=%s, bits=%s, block_size=%s, solver=%s, error_tol=%s, "
            "weighted=%s, uncompressed=%s, frozen=%s, partial replies %s, server step %s, "
            "error feedback %s",
            self.estimator_name, self.k, self.transform, self.value_bits, self.bits,
            self.block_size, self.solver, self.error_tol, self.weighted,
            list(self.uncompressed), list(self.frozen), self.partial,
            self.server_optimizer.describe(), self.error_feedback,
        )

    def _block_size(self, d: int) -> int | None:
        if self.block_size != "auto":
            return self.block_size  # type: ignore[return-value]
        big = d > AUTO_BLOCK_THRESHOLD
        blockwise = scheme_traits(self.estimator_name).takes_projection  # the seeded projection
        return AUTO_BLOCK_SIZE if big and blockwise else None

    def round_encoding(self, arrays: ArrayRecord, nonce: int) -> RoundEncoding:
        """The encoding of a round that sends ``arrays``.

        Parameters
        ----------
        arrays : ArrayRecord
            The global model the round sends.
        nonce : int
            The round's 64-bit nonce.

        Returns
        -------
        RoundEncoding
            What the clients must build; its ``k`` is the round's (chosen by
            ``target_rel_error`` when given).

        Raises
        ------
        ValueError
            When the settings do not fit the model, e.g. ``k > d``, no floating-point array
            to compress, or a ``per_layer`` mapping without some compressed array's k.
        """
        layout = Layout.of(arrays, self.uncompressed, self.frozen)
        layer_k: tuple[int, ...] = ()
        layer_block: tuple[int, ...] = ()
        if self.per_layer:
            layer_k = layer_budgets(self.per_layer, self.k, layout)
            layer_block = tuple(self._block_size(size) or 0 for size in layout.compressed_sizes)
        enc = RoundEncoding(
            scheme=self.estimator_name,
            k=self.k,
            d=layout.d,
            nonce=nonce,
            value_bits=self.value_bits,
            bits=self.bits,
            block_size=self._block_size(layout.d),
            projection=self.projection,
            weight_key=self.weighted_by_key if self.weighted else "",
            uncompressed=self.uncompressed,
            error_feedback=self.server_optimizer.lr if self.error_feedback else 0.0,
            layer_k=layer_k,
            layer_block=layer_block,
            frozen=self.frozen,
        )
        if self.target_rel_error is not None and self._last_n and self._last_n >= 1:
            enc = replace(enc, k=self._target_k(enc))
        self._round_k = enc.k
        # raises for settings that do not fit
        if layer_k:
            enc.layer_estimators(layout.compressed_sizes, n=1, transform=self.transform)
        else:
            enc.estimator(n=1, transform=self.transform)
        return enc

    def _target_k(self, enc: RoundEncoding) -> int:
        """The smallest k in ``[k_min, k]`` whose predicted relative error for the last
        round's number of replies, at the least of the smoothed and the newest R_hat (0
        before one is known: the cautious choice), is at most ``target_rel_error``; ``k``
        when none is (:class:`rpsagg.planning.BudgetPolicy`, the server's rule)."""
        n = int(self._last_n or 1)
        prior = self.tracker.prior(n) if self.transform == "auto" else None
        top = min(int(self.k or enc.d), enc.d)

        def make(k: int, bits: int) -> Estimator:
            return replace(enc, k=k, value_bits=bits).estimator(n, self.transform, prior)

        assert self.target_rel_error is not None
        policy = BudgetPolicy(self.target_rel_error, min(self.k_min, top), top,
                              (self.value_bits,), unknown_r=0.0)
        # planned at the least of the smoothed and newest R_hat (0 while none is known)
        return policy.plan([self.tracker.planning_prior(n)], make).k

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's messages, with the round's encoding and nonce in their config.

        Parameters
        ----------
        server_round : int
            The round, from 1.
        arrays : ArrayRecord
            The global model to send.
        config : ConfigRecord
            The round's train config; the rpsagg keys are added to a copy.
        grid : Grid
            Flower's grid, to sample the nodes as FedAvg does.

        Returns
        -------
        iterable of Message
            One training instruction per sampled node.

        Raises
        ------
        ValueError
            When the settings do not fit the model (``round_encoding``).
        """
        enc = self.round_encoding(arrays, self._nonces())
        round_config = ConfigRecord(dict(config))
        enc.to_config(round_config)
        self._check.ask(config, round_config)
        messages = list(super().configure_train(server_round, arrays, round_config, grid))
        self._plan = None
        if messages:
            n = len(messages)
            prior = self.tracker.prior(n) if self.transform == "auto" else None
            layout = Layout.of(arrays, self.uncompressed, self.frozen)
            layers = (enc.layer_estimators(layout.compressed_sizes, n, self.transform, prior,
                                           self.solver, self.error_tol)
                      if enc.layer_k else None)
            est = layers[0] if layers else enc.estimator(n, self.transform, prior, self.solver,
                                                         self.error_tol)
            self._plan = RoundPlan(server_round, enc, est, layout, arrays,
                                   (self.transform, self.solver, self.error_tol), layers, n,
                                   prior)
        return messages

    def aggregate_train(
        self,
        server_round: int,
        replies: Iterable[Message],
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Decode the compressed replies jointly and apply the mean update.

        Parameters
        ----------
        server_round : int
            The round, which this strategy's ``configure_train`` configured.
        replies : iterable of Message
            The replies that arrived. Error replies count as failures; replies that do not
            fit the round (another round's nonce, a second reply of a node, a malformed
            packed reply) are left out with a warning.

        Returns
        -------
        arrays : ArrayRecord or None
            The new global model; None when no reply could be used (the model stays).
        metrics : MetricRecord or None
            The clients' metrics aggregated as FedAvg does, and the ``rpsagg.*`` metrics
            of the round (the class's description).

        Raises
        ------
        RuntimeError
            A reply without the rpsagg payload under ``missing_payload="raise"``, or one
            that carries only some of the model's arrays under ``partial="refuse"``.
        """
        plan = self._plan
        valid, _ = self._check_and_log_replies(replies, is_train=True, validate=False)
        self._check.seen(valid)
        if plan is None or plan.server_round != server_round:
            if valid:
                log.warning("aggregate_train: round %d was not configured by this strategy; "
                            "%d replies ignored", server_round, len(valid))
            return None, None
        self._plan = None
        accepted = accept(plan, valid, missing_payload=self.missing_payload,
                          partial=self.partial,
                          weight_of=self._weight if self.weighted else None)
        if not accepted:
            log.warning("aggregate_train: no usable reply in round %d; the model stays",
                        server_round)
            return None, None
        weights = np.array([a.weight for a in accepted])
        if weights.sum() <= 0:
            log.warning("aggregate_train: the replies' weights sum to 0; the model stays")
            return None, None
        update, keep, decoded, seconds = decode(plan, accepted, weights)
        step = self.server_optimizer.step(update)
        slices = plan.layout.compressed_slices()
        for name in keep:  # no reply changed it: the optimizer's state moves nothing here
            step[slices[name]] = 0.0
        plain = (mean_plain([a.plain for a in accepted], weights.tolist(), plan.layout)
                 if plan.layout.plain_keys else None)
        new_arrays = apply_update(plan.arrays, plan.layout, step, plain, keep)
        msgs = [m for _, ms, _ in decoded for m in ms]

        contents = [valid[a.content_index].content for a in accepted]
        key = self.weighted_by_key
        if all(any(key in m for m in c.metric_records.values()) for c in contents):
            metrics = self.train_metrics_aggr_fn(contents, key)
        else:  # FedAvg's aggregation needs the weight in every reply; unweighted runs may not
            metrics = MetricRecord()
        metrics.update(byte_metrics(accepted, msgs))
        metrics["rpsagg.decode-seconds"] = float(seconds)
        metrics["rpsagg.unchanged-arrays"] = len(keep) + len(plan.layout.frozen_keys)
        self._last_n = len(accepted)
        if plan.layers:
            return new_arrays, metrics
        metrics["rpsagg.k"] = int(plan.encoding.k or 0)
        if self.target_rel_error is not None:
            metrics["rpsagg.target-rel-error"] = self.target_rel_error
        decode_info, rhat = decode_metrics(decoded)
        metrics.update(decode_info)
        if rhat is not None:
            self.tracker.fold(rhat, len(decoded[0][1]))
        return new_arrays, metrics

    def _weight(self, msg: Message) -> float:
        found = [m[self.weighted_by_key] for m in msg.content.metric_records.values()
                 if self.weighted_by_key in m]
        if len(found) != 1 or not isinstance(found[0], int | float) or not (
            np.isfinite(found[0]) and found[0] >= 0
        ):
            raise ValueError(f"needs one finite, non-negative {self.weighted_by_key!r} metric")
        return float(found[0])
