"""Blockwise Rand-Proj-Spatial for very large d.

The vector is cut into ``B = ceil(d / b)`` blocks of ``b = 2^m`` coordinates (the last one
zero-padded); block ``j`` gets ``k_j = k // B + (1 if j < k % B else 0)`` of the ``k`` floats
and its own SRHT with seed ``block_seed(seed, j)``. Each block is an independent
Rand-Proj-Spatial problem of dimension ``b``, so the joint decode splits into ``B`` small
ones (each with its own beta for ``(n', k_j, b, c)``). The message is still ``k`` floats plus
one seed; its scheme string ``rand-proj-spatial:block=<b>`` tells decoders the block size.

Quantized values (``value_bits < 32``, wire format ``rpsagg-seed-v5``): block ``j``'s
``k_j`` values are quantized as a message of their own, exactly as a Rand-Proj-Spatial
message of dimension ``b`` with seed ``block_seed(seed, j)`` would be (the uniform code book,
its own float32 scale ``m_j``, the rounding stream of the block's seed); the message sends
the ``k`` codes in block order and the ``B`` scales. A block whose coordinates are small
keeps its own resolution instead of sharing the largest block's grid.

What it costs: within a block the SRHT mixes coordinates as usual, across blocks it does not,
so the budget per block is fixed instead of following the energy. ``docs/performance.md``
has a measured MSE table against the full transform.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from rpsagg._decode import DEFAULT_RTOL, SolveInfo
from rpsagg._encoded import Encoded
from rpsagg._error import ErrorEstimate, combine
from rpsagg._estimator import DecodeResult, Estimator
from rpsagg._quantize import quantize_uniform
from rpsagg._spatial import SCHEME, RandProjSpatial
from rpsagg._srht import srht_encode
from rpsagg._transform import parse_transform
from rpsagg.spec import MASK64, TAG_BLOCK, check_seed, mix64

FloatArray = NDArray[np.float64]

#: ``block_size="auto"`` (the service's ``--block-size auto``, Flower's strategy): vectors
#: of more than this many coordinates are encoded blockwise ...
AUTO_BLOCK_THRESHOLD = 1 << 20
#: ... in blocks of this many coordinates.
AUTO_BLOCK_SIZE = 1 << 18


def auto_block_size(d: int) -> int:
    """The block size ``auto`` picks for dimension ``d``: :data:`AUTO_BLOCK_SIZE` when
    ``d > AUTO_BLOCK_THRESHOLD``, else 0 (one transform over all of ``d``)."""
    return AUTO_BLOCK_SIZE if d > AUTO_BLOCK_THRESHOLD else 0


def block_seed(seed: int, block: int) -> int:
    """Transform seed of block ``block``: ``mix64(mix64(seed XOR TAG_BLOCK) XOR block)``."""
    return mix64(mix64((check_seed(seed) ^ TAG_BLOCK) & MASK64) ^ check_seed(block, "block"))


def block_budgets(k: int, blocks: int) -> list[int]:
    """Floats per block: ``k // B``, plus one for the first ``k % B`` blocks."""
    return [k // blocks + (1 if j < k % blocks else 0) for j in range(blocks)]


class BlockwiseRandProjSpatial(Estimator):
    """Rand-Proj-Spatial with an independent SRHT per block of ``block_size`` coordinates.

    Parameters
    ----------
    n, k, d : int
        Clients, floats per client (``k >= ceil(d / block_size)``), dimension.
    block_size : int
        A power of two; ``d`` is cut into ``ceil(d / block_size)`` blocks.
    transform, prior_r, method, rtol, device, threads, error_tol
        As for :class:`~rpsagg._estimators.RandProjSpatial`, applied in every block.
    """

    traits = replace(RandProjSpatial.traits, supports_r_hat=False)
    _mixes_all_inputs = True  # every block sends >= 1 value mixing all its coordinates
    projection = "srht"  # every block is an SRHT of dimension block_size

    def __init__(
        self,
        n: int,
        k: int,
        d: int,
        block_size: int,
        transform: str | float = "avg",
        prior_r: float | None = None,
        method: str = "auto",
        rtol: float = DEFAULT_RTOL,
        device: str | None = None,
        threads: int | None = None,
        error_tol: float | None = None,
    ) -> None:
        super().__init__(n, k, d)
        if isinstance(block_size, bool) or not isinstance(block_size, int | np.integer):
            raise ValueError(f"block_size must be an integer power of two; got {block_size!r}")
        if block_size < 2 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 2; got {block_size}")
        self.block_size = int(block_size)
        self.blocks = -(-self.d // self.block_size)
        if self.k < self.blocks:
            raise ValueError(
                f"k must be >= the number of blocks ceil(d / block_size) = {self.blocks}; "
                f"got k={self.k}"
            )
        self.name = f"{SCHEME}:block={self.block_size}"
        self.transform = parse_transform(transform, self.n, prior_r)
        self.budgets = block_budgets(self.k, self.blocks)
        # One sub-estimator per distinct budget (at most two): they share beta caches.
        self._sub = {
            kb: RandProjSpatial(
                self.n, kb, self.block_size, transform, prior_r, method=method, rtol=rtol,
                device=device, threads=threads, error_tol=error_tol,
            )
            for kb in set(self.budgets)
        }

    def _encode(self, x: FloatArray, seed: int) -> tuple[FloatArray, NDArray[np.int64] | None]:
        b = self.block_size
        parts = [
            srht_encode(x[j * b : (j + 1) * b], block_seed(seed, j), kb, b)
            for j, kb in enumerate(self.budgets)
        ]
        return np.concatenate(parts), None

    def _set_value_bits(self, value_bits: int) -> None:
        super()._set_value_bits(value_bits)
        for sub in self._sub.values():  # each block is quantized as such a message
            sub._set_value_bits(value_bits)

    @property
    def scale_counts(self) -> tuple[int, ...]:
        """Values per scale of a quantized message: the block budgets (one scale per block)."""
        return tuple(self.budgets)

    def _quantize_message(
        self, values: FloatArray, seed: int
    ) -> tuple[NDArray[np.uint32], NDArray[np.float32]]:
        """Each block's values quantized on their own (``docs/wire-format.md`` section 15):
        codes from the block's seed's rounding stream, one float32 scale per block."""
        codes = np.empty(values.size, dtype=np.uint32)
        scales = np.empty(self.blocks, dtype=np.float32)
        offset = 0
        for j, kb in enumerate(self.budgets):
            codes[offset : offset + kb], scales[j] = quantize_uniform(
                values[offset : offset + kb], self.value_bits, block_seed(seed, j)
            )
            offset += kb
        return codes, scales

    def block_messages(self, batch: Sequence[Encoded], j: int) -> list[Encoded]:
        """Block ``j`` of each message as a plain Rand-Proj-Spatial message.

        Parameters
        ----------
        batch : sequence of Encoded
            Messages of this estimator (``k`` values each).
        j : int
            The block, ``0 <= j < blocks``.

        Returns
        -------
        list of Encoded
            For each message, the SRHT sketch of its block ``j``: ``budgets[j]`` values,
            seed ``block_seed(seed, j)``, dimension ``block_size`` (what ``correlation_terms``
            and the block's own decode take); a quantized message's block keeps its codes
            and its block's scale.
        """
        if not 0 <= j < self.blocks:
            raise ValueError(f"need 0 <= j < {self.blocks}; got {j}")
        return self._block_batch(batch, j, sum(self.budgets[:j]))

    def _block_batch(self, batch: Sequence[Encoded], j: int, offset: int) -> list[Encoded]:
        kb = self.budgets[j]
        name = self._sub[kb].name
        out = []
        for m in batch:
            values = m.values[offset : offset + kb]
            if m.codes is not None and m.scales is not None:  # the block as a §13 message
                out.append(Encoded(name, block_seed(m.seed, j), kb, self.block_size, values,
                                   spec_version=m.spec_version, value_bits=m.value_bits,
                                   codes=m.codes[offset : offset + kb],
                                   scales=m.scales[j : j + 1]))
            else:
                out.append(Encoded(name, block_seed(m.seed, j), kb, self.block_size, values))
        return out

    def decode_blocks(
        self, batch: list[Encoded], first: int, stop: int, betas: dict[int, float] | None = None
    ) -> tuple[FloatArray, list[SolveInfo], float]:
        """Estimates of blocks ``first .. stop - 1`` (concatenated, ``(stop - first) b``).

        The unit of work of a distributed decode (the Ray backend runs it per group of
        blocks); :meth:`decode` is this over all blocks. ``betas`` maps a block budget to
        its beta (:meth:`block_betas`), computed on the caller's side; None computes them.

        Returns
        -------
        estimate : ndarray, shape ((stop - first) * block_size,)
        infos : list of SolveInfo
            One per block that solved a system.
        c : float
            The transform coefficient.
        """
        if not 0 <= first < stop <= self.blocks:
            raise ValueError(f"need 0 <= first < stop <= {self.blocks}; got {first}, {stop}")
        b = self.block_size
        out = np.empty((stop - first) * b)
        offset = sum(self.budgets[:first])
        infos: list[SolveInfo] = []
        c = 0.0
        for j in range(first, stop):
            kb = self.budgets[j]
            sub = self._sub[kb]
            msgs = self._block_batch(batch, j, offset)
            result = sub._decode(msgs, None if betas is None else betas[kb])
            out[(j - first) * b : (j - first + 1) * b] = result.estimate
            if result.solve is not None:
                infos.append(result.solve)
            c = 0.0 if result.c is None else result.c
            offset += kb
        return out, infos, c

    def block_betas(self, n_prime: int) -> dict[int, float]:
        """beta of each distinct block budget for ``n_prime`` messages."""
        return {kb: sub.beta_for(n_prime) for kb, sub in self._sub.items()}

    def assemble(
        self, parts: list[FloatArray], infos: list[SolveInfo], c: float, n_prime: int,
        batch: Sequence[Encoded] | None = None,
    ) -> DecodeResult:
        """The :class:`DecodeResult` of all blocks from the in-order results of
        :meth:`decode_blocks` over consecutive ranges covering every block; with the
        decoded ``batch`` it carries the error estimate (the sum of the blocks')."""
        out = np.concatenate(parts)
        if out.shape[0] != self.blocks * self.block_size:
            raise ValueError("the parts do not cover every block")
        methods = {i.method for i in infos}
        info = SolveInfo(
            "+".join(sorted(methods)),
            sum(i.iterations for i in infos),
            max((i.residual for i in infos), default=0.0),
            sum(i.seconds for i in infos),
        )
        error = None
        if batch is not None and len(infos) == self.blocks:
            error = self._block_errors(list(batch), infos, c)
        return DecodeResult(out[: self.d], n_prime, self._beta(n_prime), c, info, 0.0, error)

    def _block_errors(self, batch: list[Encoded], infos: list[SolveInfo],
                      c: float) -> ErrorEstimate:
        """The error estimate: the sum over blocks of each block's (blocks are independent
        Rand-Proj-Spatial problems); the zero padding of the last block is not discounted."""
        betas = self.block_betas(len(batch))
        parts = []
        offset = 0
        for j, (kb, info) in enumerate(zip(self.budgets, infos, strict=True)):
            msgs = self._block_batch(batch, j, offset)
            y = np.stack([m.values.astype(np.float64) for m in msgs])
            adjoint_sq = info.adjoint_sq
            if adjoint_sq is None:
                from rpsagg._srht import JointSRHT

                back = JointSRHT.from_seeds([m.seed for m in msgs], kb,
                                            self.block_size).adjoint(y)
                adjoint_sq = float(back @ back)
            parts.append(self._sub[kb].error_from_sketches(msgs, y, adjoint_sq, c, betas[kb]))
            offset += kb
        return combine(parts)

    def _decode(self, batch: list[Encoded]) -> DecodeResult:
        out, infos, c = self.decode_blocks(batch, 0, self.blocks)
        return self.assemble([out], infos, c, len(batch), batch)

    def _beta(self, n_prime: int) -> float:
        """beta of the first block (blocks with one float fewer have their own)."""
        return self._sub[self.budgets[0]].beta_for(n_prime)

    def with_device(self, device: str | None) -> BlockwiseRandProjSpatial:
        """A copy whose blocks decode on ``device`` (PyTorch; None for numpy)."""
        other = copy.copy(self)
        other._sub = {kb: sub.with_device(device) for kb, sub in self._sub.items()}
        return other

    def with_threads(self, threads: int | None) -> BlockwiseRandProjSpatial:
        """A copy whose blocks decode with ``threads`` CPU threads (None: every core)."""
        other = copy.copy(self)
        other._sub = {kb: sub.with_threads(threads) for kb, sub in self._sub.items()}
        return other

    def with_prior(self, prior_r: float | None) -> BlockwiseRandProjSpatial:
        """A copy whose ``transform="auto"`` uses the prior correlation ``prior_r``."""
        if self.transform.kind != "auto":
            raise ValueError("with_prior needs an estimator built with transform='auto'")
        sub = next(iter(self._sub.values()))
        other = BlockwiseRandProjSpatial(
            self.n, self.k, self.d, self.block_size, "auto", prior_r, sub.method, sub.rtol,
            device=sub.device, threads=sub.threads, error_tol=sub.error_tol,
        )
        if self.value_bits != 32:
            other._set_value_bits(self.value_bits)
        return other

    def predicted_relative_error(self, r: float) -> float:
        """The blocks' predicted relative error, weighted by their share of the values
        (each block sees the correlation R; energy is assumed spread evenly over blocks)."""
        total = 0.0
        for kb in self.budgets:
            total += self._sub[kb].predicted_relative_error(r)
        return total / self.blocks

    def __repr__(self) -> str:
        return (
            f"BlockwiseRandProjSpatial(n={self.n}, k={self.k}, d={self.d}, "
            f"block_size={self.block_size}, T={self.transform.label()}{self._bits_label()})"
        )
