"""What the strategy tells the clients each round: the estimator, its budget and the nonce.

The strategy writes these keys into the training round's ``ConfigRecord``; the client mod
reads them back and builds the same encoder. Everything a client and the server must agree
on (the estimator, ``k``, ``d``, the quantization, the block size, the projection and the
round nonce) travels here; the transform (``avg``, ``max``, ...) only matters to the
decoder and stays on the server.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flwr.app import ConfigRecord

from rpsagg import ESTIMATOR_NAMES, QUANTIZER_NAMES, Estimator, make_estimator
from rpsagg.projections import AUTO_BLOCK_SIZE, AUTO_BLOCK_THRESHOLD
from rpsagg.schemes import scheme_traits

#: ``error_tol="auto"``: the conjugate gradients of a blockwise Rand-Proj-Spatial decode stop
#: once the solve moves the estimate by at most this share of a bound below the estimator's
#: RMS error (the 2M-parameter benchmark model: 0.3% of the error, half the decode time;
#: docs/performance.md); other decodes keep the residual target alone
AUTO_ERROR_TOL = 1e-2

#: Prefix of every key this package adds to a ``ConfigRecord``.
PREFIX = "rpsagg."
KEY_SCHEME = PREFIX + "scheme"
KEY_K = PREFIX + "k"
KEY_D = PREFIX + "d"
KEY_NONCE = PREFIX + "nonce"
KEY_VALUE_BITS = PREFIX + "value-bits"
KEY_BITS = PREFIX + "bits"
KEY_BLOCK_SIZE = PREFIX + "block-size"
KEY_PROJECTION = PREFIX + "projection"
KEY_WEIGHT = PREFIX + "weight-key"
KEY_SPEC = PREFIX + "spec-version"
KEY_UNCOMPRESSED = PREFIX + "uncompressed"
KEY_ERROR_FEEDBACK = PREFIX + "error-feedback"
KEY_LAYER_K = PREFIX + "layer-k"
KEY_LAYER_BLOCK = PREFIX + "layer-block-size"
KEY_FROZEN = PREFIX + "frozen"
#: asks the clients for the check record of :mod:`rpsagg_flower.dpcheck`
KEY_CHECK = PREFIX + "check"
#: the config key of Flower's client-side clipping wrappers (``clipping_norm``: the norm its
#: clipping mods clip each update to); Flower's own constant is not public API, and
#: ``tests/flower/test_robustness.py`` checks that the two agree
KEY_CLIPPING_NORM = "clipping_norm"

# Models with more coordinates than AUTO_BLOCK_THRESHOLD are encoded blockwise by
# block_size="auto" (Rand-Proj-Spatial, float32 or quantized values), in blocks of
# AUTO_BLOCK_SIZE: the library's constants, which the service's --block-size auto uses too.
__all__ = ["AUTO_BLOCK_SIZE", "AUTO_BLOCK_THRESHOLD"]


def nonce_to_bytes(nonce: int) -> bytes:
    """A 64-bit nonce as 8 big-endian bytes (a ``ConfigRecord`` int is signed 64-bit)."""
    return int(nonce).to_bytes(8, "big")


def nonce_from_bytes(raw: object) -> int:
    """Inverse of :func:`nonce_to_bytes`; ``ValueError`` unless ``raw`` is 8 bytes."""
    if not isinstance(raw, bytes) or len(raw) != 8:
        raise ValueError(f"a 64-bit value must travel as 8 bytes; got {raw!r:.40}")
    return int.from_bytes(raw, "big")


@dataclass(frozen=True)
class RoundEncoding:
    """The encoder of one training round, as the clients must build it.

    Attributes
    ----------
    scheme : str
        An estimator name of ``rpsagg.make_estimator`` (``rpsagg.ESTIMATOR_NAMES`` or
        ``rpsagg.QUANTIZER_NAMES``).
    k : int or None
        Values per client (None for ``"eden"`` and ``"qsgd"``, which send every coordinate).
    d : int
        Coordinates of the flattened model update.
    nonce : int
        The round's 64-bit nonce; a client's transform seed is
        ``derive_round_seed(client_seed, nonce, str(node_id))``.
    value_bits : int
        32, or fewer to send the values as stochastically rounded codes.
    bits : int or None
        Bits per coordinate of ``"eden"`` and ``"qsgd"``.
    block_size : int or None
        Rand-Proj-Spatial's block size (None: one transform over all of ``d``).
    projection : str
        Rand-Proj-Spatial's projection (``"auto"``, ``"srht"``, ``"dct"``, ``"hblocks"``).
    weight_key : str
        The reply ``MetricRecord`` key a client scales its update by (``""``: unweighted).
    uncompressed : tuple of str
        Arrays sent uncompressed although floating point (non-floating arrays always are).
    error_feedback : float
        0: no client memory. Otherwise the step ``gamma`` the server applies to the decoded
        mean: each client keeps ``e`` in its context state, encodes ``v = update + e`` and
        keeps ``e = v - gamma * decode(own message)`` (``rpsagg_flower.mod``).
    layer_k : tuple of int
        Per-layer compression: one estimator message per compressed array, with these
        ``k`` (0 for ``"eden"`` and ``"qsgd"``); empty: one message of the flattened update.
    layer_block : tuple of int
        Per-layer Rand-Proj-Spatial block sizes (0: one transform per layer).
    frozen : tuple of str
        Arrays that never travel up (the server keeps them); not part of ``d``.
    """

    scheme: str
    k: int | None
    d: int
    nonce: int
    value_bits: int = 32
    bits: int | None = None
    block_size: int | None = None
    projection: str = "auto"
    weight_key: str = ""
    uncompressed: tuple[str, ...] = ()
    error_feedback: float = 0.0
    layer_k: tuple[int, ...] = ()
    layer_block: tuple[int, ...] = ()
    frozen: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.scheme not in ESTIMATOR_NAMES + QUANTIZER_NAMES:
            raise ValueError(
                f"unknown estimator {self.scheme!r}; expected one of "
                f"{', '.join(ESTIMATOR_NAMES + QUANTIZER_NAMES)}"
            )

    def estimator(
        self, n: int, transform: str | float = "avg", prior_r: float | None = None,
        method: str = "auto", error_tol: float | str | None = None,
    ) -> Estimator:
        """The estimator of the round for ``n`` clients.

        The clients' choice of ``n`` does not matter: an encode depends on neither ``n``
        nor the transform, nor the decoder's joint solver ``method`` and ``error_tol``.

        Parameters
        ----------
        n : int
            The replies to decode jointly.
        transform : str or float
            The spatial estimators' transform (``"avg"``, ``"max"``, ``"one"``, ``"auto"``
            or a number); the others ignore it.
        prior_r : float, optional
            The correlation R that ``transform="auto"`` uses.
        method : {"auto", "exact", "cg"}
            The spatial decoders' joint solver.
        error_tol : float, "auto" or None
            Goes to the decoders it applies to (Rand-Proj-Spatial with the SRHT, blockwise
            included); the others decode with ``rtol`` alone. ``"auto"``:
            ``AUTO_ERROR_TOL`` (1e-2) for a blockwise decode, None for any other.

        Returns
        -------
        rpsagg.Estimator
            From ``rpsagg.make_estimator``.
        """
        spatial = scheme_traits(self.scheme).takes_transform
        srht = scheme_traits(self.scheme).takes_projection and (
            self.block_size is not None or self.projection == "srht"
            or (self.projection == "auto" and self.d & (self.d - 1) == 0))
        if error_tol == "auto":
            error_tol = AUTO_ERROR_TOL if self.block_size is not None else None
        elif isinstance(error_tol, str):
            raise ValueError(f"error_tol must be a number in (0, 1), 'auto' or None; got "
                             f"{error_tol!r}")
        return make_estimator(
            self.scheme,
            n=n,
            k=self.k,
            d=self.d,
            transform=transform if spatial else "avg",
            prior_r=prior_r if spatial else None,
            block_size=self.block_size,
            bits=self.bits,
            value_bits=self.value_bits,
            projection=self.projection,
            method=method if spatial else "auto",
            error_tol=error_tol if srht else None,
        )

    def reduced(self, d: int) -> RoundEncoding:
        """The encoding of a sketch of ``d`` of the round's coordinates.

        A reply whose other compressed arrays are zero or absent sends such a sketch. Client
        and server both build it from the round's encoding and the reply's bitmaps, so they
        agree without another message.

        Parameters
        ----------
        d : int
            The coordinates of the sketch, ``1 <= d <=`` the round's ``d``.

        Returns
        -------
        RoundEncoding
            ``k`` capped at ``d``, one message (no per-layer split), the rest as the
            round's.

        Raises
        ------
        ValueError
            When ``d`` is out of range.
        """
        if not 1 <= d <= self.d:
            raise ValueError(f"a reduced sketch needs 1 <= d <= {self.d}; got {d}")
        k = None if self.k is None else min(self.k, d)
        return replace(self, d=d, k=k, layer_k=(), layer_block=())

    def layer_estimators(
        self, sizes: tuple[int, ...], n: int, transform: str | float = "avg",
        prior_r: float | None = None, method: str = "auto",
        error_tol: float | str | None = None,
    ) -> list[Estimator]:
        """Per-layer compression: one estimator per compressed array.

        Parameters
        ----------
        sizes : tuple of int
            The coordinates of each compressed array, in record order.
        n, transform, prior_r, method, error_tol
            As for ``estimator``.

        Returns
        -------
        list of rpsagg.Estimator
            One per array, with its ``layer_k`` and ``layer_block``.

        Raises
        ------
        ValueError
            When ``sizes`` does not match ``layer_k`` or the round's ``d``.
        """
        if len(sizes) != len(self.layer_k) or len(self.layer_block) != len(self.layer_k):
            raise ValueError(f"the round has {len(self.layer_k)} layers; the model "
                             f"{len(sizes)}")
        if sum(sizes) != self.d:
            raise ValueError(f"layers of {sum(sizes)} coordinates; the round says {self.d}")
        out = []
        for size, k, block in zip(sizes, self.layer_k, self.layer_block, strict=True):
            layer = RoundEncoding(self.scheme, k or None, size, self.nonce, self.value_bits,
                                  self.bits, block or None, self.projection, self.weight_key)
            out.append(layer.estimator(n, transform, prior_r, method, error_tol))
        return out

    def to_config(self, config: ConfigRecord) -> None:
        """Write the keys into ``config`` (in place).

        Parameters
        ----------
        config : ConfigRecord
            The round's train config; the keys all start with ``rpsagg.``.
        """
        config[KEY_SCHEME] = self.scheme
        config[KEY_K] = 0 if self.k is None else int(self.k)
        config[KEY_D] = int(self.d)
        config[KEY_NONCE] = nonce_to_bytes(self.nonce)
        config[KEY_VALUE_BITS] = int(self.value_bits)
        config[KEY_BITS] = 0 if self.bits is None else int(self.bits)
        config[KEY_BLOCK_SIZE] = 0 if self.block_size is None else int(self.block_size)
        config[KEY_PROJECTION] = self.projection
        config[KEY_WEIGHT] = self.weight_key
        config[KEY_UNCOMPRESSED] = list(self.uncompressed)
        config[KEY_ERROR_FEEDBACK] = float(self.error_feedback)
        config[KEY_LAYER_K] = [int(k) for k in self.layer_k]
        config[KEY_LAYER_BLOCK] = [int(b) for b in self.layer_block]
        config[KEY_FROZEN] = list(self.frozen)

    @classmethod
    def from_config(cls, config: ConfigRecord) -> RoundEncoding | None:
        """The encoding the strategy asked for in a round's config.

        Parameters
        ----------
        config : ConfigRecord
            A training instruction's config.

        Returns
        -------
        RoundEncoding or None
            None when ``config`` has no ``rpsagg.scheme`` (the round is not compressed).

        Raises
        ------
        ValueError
            For malformed or missing ``rpsagg.`` keys.
        """
        if KEY_SCHEME not in config:
            return None
        try:
            k = int(config[KEY_K])  # type: ignore[arg-type]
            bits = int(config[KEY_BITS])  # type: ignore[arg-type]
            block = int(config[KEY_BLOCK_SIZE])  # type: ignore[arg-type]
            return cls(
                scheme=str(config[KEY_SCHEME]),
                k=k or None,
                d=int(config[KEY_D]),  # type: ignore[arg-type]
                nonce=nonce_from_bytes(config[KEY_NONCE]),
                value_bits=int(config[KEY_VALUE_BITS]),  # type: ignore[arg-type]
                bits=bits or None,
                block_size=block or None,
                projection=str(config[KEY_PROJECTION]),
                weight_key=str(config[KEY_WEIGHT]),
                uncompressed=tuple(str(u) for u in config.get(KEY_UNCOMPRESSED, [])),  # type: ignore[union-attr]
                error_feedback=float(config.get(KEY_ERROR_FEEDBACK, 0.0)),  # type: ignore[arg-type]
                layer_k=tuple(int(k) for k in config.get(KEY_LAYER_K, [])),  # type: ignore[union-attr]
                layer_block=tuple(int(b) for b in config.get(KEY_LAYER_BLOCK, [])),  # type: ignore[union-attr]
                frozen=tuple(str(f) for f in config.get(KEY_FROZEN, [])),  # type: ignore[union-attr]
            )
        except KeyError as exc:
            raise ValueError(f"the round's config lacks {exc.args[0]!r}") from None
        except TypeError as exc:
            raise ValueError(f"malformed rpsagg keys in the round's config: {exc}") from None
