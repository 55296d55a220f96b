#!/usr/bin/env python3
"""Check an implementation of the rpsagg wire format against docs/wire-vectors.json.

Usage::

    python3 conformance/run.py [--vectors docs/wire-vectors.json] [--timeout 60] \\
        [--verbose] -- COMMAND [ARG ...]

COMMAND is started once; the runner writes one JSON request per line to its stdin and reads
one JSON reply per line from its stdout (conformance/README.md defines the requests). Every
check is derived from the vectors file; the runner prints one line per failed check and a
summary, and exits 0 when every check passed, 1 when one failed, 2 when the implementation
could not be run (it exited, or a reply did not come within --timeout seconds, or was not
JSON). Python 3.10+ standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wire_reference import golden_x, named_x  # beside this file: the vectors' inputs

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VECTORS = ROOT / "docs" / "wire-vectors.json"

Check = tuple[str, dict[str, Any], Callable[[dict[str, Any]], str | None]]


class ImplementationError(Exception):
    """The implementation could not answer (exited, timed out, wrote something not JSON)."""


class Implementation:
    """The command under test, answering one JSON line per request line."""

    def __init__(self, command: list[str], timeout: float) -> None:
        self.timeout = timeout
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            encoding="utf-8",
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise ImplementationError(f"cannot write to the implementation: {exc}") from None
        try:
            line = self.lines.get(timeout=self.timeout)
        except queue.Empty:
            raise ImplementationError(
                f"no reply within {self.timeout:g} s to {json.dumps(request)[:200]}") from None
        if line is None:
            raise ImplementationError(
                f"the implementation exited (status {self.proc.wait()}) before answering "
                f"{json.dumps(request)[:200]}")
        try:
            reply = json.loads(line)
        except ValueError:
            raise ImplementationError(f"reply is not JSON: {line[:200]!r}") from None
        if not isinstance(reply, dict):
            raise ImplementationError(f"reply is not a JSON object: {line[:200]!r}")
        return reply

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- comparisons ---------------------------------------------------------------------------
def _field(reply: dict[str, Any], name: str) -> Any:
    if "error" in reply:
        raise ValueError(f"error reply: {reply['error']}")
    if name not in reply:
        raise ValueError(f"reply lacks {name!r}")
    return reply[name]


def _hex_ints(values: Any) -> list[int]:
    return [int(str(v), 16) for v in values]


def equal(name: str, expected: Any, norm: Callable[[Any], Any] = lambda v: v
          ) -> Callable[[dict[str, Any]], str | None]:
    """The reply's ``name`` equals ``expected`` after ``norm``."""
    def check(reply: dict[str, Any]) -> str | None:
        got = norm(_field(reply, name))
        want = norm(expected)
        return None if got == want else f"{name}: expected {want!r}, got {got!r}"
    return check


def same_message(expected: dict[str, Any]) -> Callable[[dict[str, Any]], str | None]:
    """A quantized message: packed codes, value_bits, value_count, the scale's bits (or the
    block scales' bits), all exact."""
    def check(reply: dict[str, Any]) -> str | None:
        for name in ("packed_hex", "scale_bits", "scales_bits", "value_bits", "value_count"):
            if name not in expected:
                continue
            got, want = _field(reply, name), expected[name]
            if name == "scale_bits":
                got, want = int(str(got), 16), int(str(want), 16)
            elif name == "scales_bits":
                got, want = _hex_ints(got), _hex_ints(want)
            elif name == "packed_hex":
                got, want = str(got).lower(), str(want).lower()
            if got != want:
                return f"{name}: expected {want!r}, got {got!r}"
        return None
    return check


def refused() -> Callable[[dict[str, Any]], str | None]:
    """The implementation refuses the request (``{"refused": why}``)."""
    def check(reply: dict[str, Any]) -> str | None:
        if "refused" in reply:
            return None
        if "error" in reply:
            return f"error reply instead of a refusal: {reply['error']}"
        return f"accepted: {json.dumps(reply)[:120]}"
    return check


def sparse_message(values: list[str], indices: list[int]
                   ) -> Callable[[dict[str, Any]], str | None]:
    """A message with indices (Rand-k-Wangni, Induced): values and indices, in order."""
    value_check = equal("values_f32", values, _hex_ints)
    index_check = equal("indices", indices)

    def check(reply: dict[str, Any]) -> str | None:
        return index_check(reply) or value_check(reply)
    return check


def f32(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def within(y_f64: list[str], tol: float, exact_bits: list[str] | None
           ) -> Callable[[dict[str, Any]], str | None]:
    """binary32 values within ``tol`` of the reference (and equal to ``exact_bits`` if given)."""
    ref = [float(v) for v in y_f64]

    def check(reply: dict[str, Any]) -> str | None:
        bits = _hex_ints(_field(reply, "values_f32"))
        if len(bits) != len(ref):
            return f"values_f32: expected {len(ref)} values, got {len(bits)}"
        if exact_bits is not None and bits != _hex_ints(exact_bits):
            return f"values_f32: expected bits {exact_bits}, got {[hex(b) for b in bits]}"
        worst = max((abs(f32(b) - r) for b, r in zip(bits, ref, strict=True)), default=0.0)
        if not worst <= tol:  # also NaN
            return f"values_f32: off the reference by {worst:.3g} > tolerance {tol:.3g}"
        return None
    return check


# -- the checks the vectors define ---------------------------------------------------------
def tolerance(rel: float, x: list[float]) -> float:
    """docs/wire-format.md section 11: ``rel * max(1, ||x||_2)``."""
    return rel * max(1.0, math.sqrt(sum(v * v for v in x)))


def is_power_of_4(b: int) -> bool:
    return b & (b - 1) == 0 and (b.bit_length() - 1) % 2 == 0


def build_checks(v: dict[str, Any]) -> list[Check]:
    """Every check of the vectors file: (name, request, verdict on the reply)."""
    out: list[Check] = []
    tags = v["tags"]
    hexnorm = _hex_ints
    for state, words in v["published_splitmix64"].items():
        out.append((f"published_splitmix64[{state}]",
                    {"op": "words", "key": hex(int(state)), "start": 0, "count": len(words)},
                    equal("words", words, hexnorm)))
    for seed, keys in v["keys"].items():
        for name, key in keys.items():
            out.append((f"keys[{seed}].{tags[name]}",
                        {"op": "stream_key", "seed": seed, "tag": tags[name]},
                        equal("key", key, lambda k: int(str(k), 16))))
    for seed, words in v["sign_words"].items():
        out.append((f"sign_words[{seed}]",
                    {"op": "words", "key": v["keys"][seed]["SIGNS"], "start": 0,
                     "count": len(words)},
                    equal("words", words, hexnorm)))
    for name, words in v["tag_words"].items():
        out.append((f"tag_words.{tags[name]}",
                    {"op": "words", "key": v["keys"]["0x1"][name], "start": 0,
                     "count": len(words)},
                    equal("words", words, hexnorm)))
    hexint: Callable[[Any], int] = lambda s: int(str(s), 16)  # noqa: E731

    def bits(label: str, seed: str, tag: str, count: int, want: str) -> None:
        out.append((label, {"op": "bits", "seed": seed, "tag": tag, "count": min(64, count)},
                    equal("bits", want, hexint)))

    def sample(label: str, seed: str, tag: str, k: int, bound: int, want: list[int]) -> None:
        out.append((label, {"op": "sample_distinct", "seed": seed, "tag": tag, "k": k,
                            "bound": bound}, equal("values", want)))

    for i, c in enumerate(v["srht_cases"]):
        s, k, d, dp = c["seed"], c["k"], c["d"], c["d_pad"]
        at = f"srht_cases[{i}] (seed {s}, k={k}, d={d})"
        bits(f"{at}.sign_bits", s, "rpsSIGNS", dp, c["sign_bits"])
        sample(f"{at}.rows", s, "rpsROWS_", k, dp, c["rows"])
        sample(f"{at}.randk", s, "rpsRANDK", k, d, c["randk"])
        sample(f"{at}.induced", s, "rpsINDCD", k - k // 2, d, c["induced"])
        out.append((f"{at}.wangni_u", {"op": "uniforms", "seed": s, "tag": "rpsWNGNI",
                                       "count": len(c["wangni_u"])},
                    equal("values", c["wangni_u"], lambda u: [float.fromhex(a) for a in u])))
        out.append((f"{at}.y", {"op": "encode", "scheme": "rand-proj-spatial", "seed": s,
                                "k": k, "d": d, "x": golden_x(d)},
                    equal("values_f32", c["y"], hexnorm)))
    for i, c in enumerate(v["dct_cases"]):
        s, k, d = c["seed"], c["k"], c["d"]
        at = f"dct_cases[{i}] (seed {s}, k={k}, d={d})"
        bits(f"{at}.sign_bits", s, "rpsSIGNS", d, c["sign_bits"])
        sample(f"{at}.shift", s, "rpsSHIFT", 1, d, [c["shift"]])
        sample(f"{at}.rows", s, "rpsROWS_", k, d, c["rows"])
        x = golden_x(d)
        out.append((f"{at}.y", {"op": "encode", "scheme": "rand-proj-spatial:dct", "seed": s,
                                "k": k, "d": d, "x": x},
                    within(c["y_f64"], tolerance(v["dct_abs_tolerance"], x), None)))
    for i, c in enumerate(v["hblocks_cases"]):
        s, k, d, b = c["seed"], c["k"], c["d"], c["b"]
        at = f"hblocks_cases[{i}] (seed {s}, k={k}, d={d})"
        bits(f"{at}.sign_bits", s, "rpsSIGNS", d, c["sign_bits"])
        bits(f"{at}.sign2_bits", s, "rpsSIGN2", b - (d - b), c["sign2_bits"])
        sample(f"{at}.shift", s, "rpsSHIFT", 1, d, [c["shift"]])
        sample(f"{at}.rows", s, "rpsROWS_", k, d, c["rows"])
        x = golden_x(d)
        exact = c["y_f32"] if is_power_of_4(b) else None
        out.append((f"{at}.y", {"op": "encode", "scheme": "rand-proj-spatial:hblocks",
                                "seed": s, "k": k, "d": d, "x": x},
                    within(c["y_f64"], tolerance(v["hblocks_abs_tolerance"], x), exact)))
    for i, c in enumerate(v["blockwise_cases"]):
        s, k, d = c["seed"], c["k"], c["d"]
        at = f"blockwise_cases[{i}] (seed {s}, k={k}, d={d}, b={c['block_size']})"
        for j, want in enumerate(c["block_seeds"]):
            out.append((f"{at}.block_seeds[{j}]", {"op": "block_seed", "seed": s, "block": j},
                        equal("seed", want, hexint)))
        out.append((f"{at}.y", {"op": "encode", "scheme": c["scheme"], "seed": s, "k": k,
                                "d": d, "x": golden_x(d)},
                    equal("values_f32", c["y"], hexnorm)))
    for i, c in enumerate(v.get("blockwise_quantized_cases", [])):
        s, k, d, b, vb = c["seed"], c["k"], c["d"], c["block_size"], c["value_bits"]
        xkind = c.get("x", "golden")
        at = (f"blockwise_quantized_cases[{i}] (seed {s}, k={k}, d={d}, b={b}, "
              f"value_bits={vb}" + (", x=0)" if xkind == "zero" else ")"))
        for j, blk in enumerate(c["blocks"]):
            out.append((f"{at}.blocks[{j}].seed", {"op": "block_seed", "seed": s, "block": j},
                        equal("seed", blk["seed"], hexint)))
            out.append((f"{at}.blocks[{j}].quantize",
                        {"op": "quantize", "codebook": "uniform", "bits": vb,
                         "seed": blk["seed"], "values_f64": blk["values_f64"]},
                        same_message({n: blk[n] for n in ("packed_hex", "scale_bits")})))
        out.append((f"{at}.encode", {"op": "encode", "scheme": c["scheme"], "seed": s, "k": k,
                                     "d": d, "value_bits": vb, "x": named_x(xkind, d)},
                    same_message(c)))
    for i, r in enumerate(v["round"]):
        req = {"op": "round_seed", **{f: r[f] for f in
                                       ("client_seed", "nonce", "client_id", "vector_index")}}
        out.append((f"round[{i}]", req, equal("seed", r["seed"], hexint)))
    for bits_, table in v["lloyd_max_centroids"].items():
        out.append((f"lloyd_max_centroids[{bits_}]", {"op": "centroids", "bits": int(bits_)},
                    equal("values", table, lambda u: [float.fromhex(a) for a in u])))
    for i, c in enumerate(v["quantized_cases"]):
        d, xkind, opts = c.get("d", 20), c.get("x", "golden"), c["options"]
        scheme = c["message_scheme"]
        at = f"quantized_cases[{i}] ({scheme}, {json.dumps(opts, sort_keys=True)}, d={d}" + (
            ", x=0)" if xkind == "zero" else ")")
        enc: dict[str, Any] = {"op": "encode", "scheme": scheme, "seed": c["seed"], "d": d,
                               "x": named_x(xkind, d)}
        if "k" in opts:
            enc["k"] = opts["k"]
        if scheme in ("eden", "qsgd"):
            enc["bits"], codebook, qbits = opts["bits"], scheme, opts["bits"]
        else:
            enc["value_bits"], codebook, qbits = opts["value_bits"], "uniform", opts[
                "value_bits"]
        out.append((f"{at}.encode", enc, same_message(c)))
        out.append((f"{at}.quantize", {"op": "quantize", "codebook": codebook, "bits": qbits,
                                       "seed": c["seed"], "values_f64": c["values_f64"]},
                    same_message({n: c[n] for n in ("packed_hex", "scale_bits")})))
    for i, c in enumerate(v.get("qsgd_norm_cases", [])):
        x = [float.fromhex(a) for a in c["x"]]
        at = f"qsgd_norm_cases[{i}] (d={len(x)}, bits={c['bits']})"
        out.append((f"{at}.encode", {"op": "encode", "scheme": "qsgd", "seed": c["seed"],
                                     "d": len(x), "bits": c["bits"], "x": x},
                    same_message(c)))
        out.append((f"{at}.quantize", {"op": "quantize", "codebook": "qsgd", "bits": c["bits"],
                                       "seed": c["seed"], "values_f64": c["x"]},
                    same_message({n: c[n] for n in ("packed_hex", "scale_bits")})))
    for group, scheme in (("wangni_cases", "rand-k-wangni"), ("induced_cases", "induced")):
        for i, c in enumerate(v.get(group, [])):
            s, k, d = c["seed"], c["k"], c["d"]
            at = f"{group}[{i}] (seed {s}, k={k}, d={d}, x {c['x']})"
            out.append((at, {"op": "encode", "scheme": scheme, "seed": s, "k": k, "d": d,
                             "x": named_x(c["x"], d)},
                        sparse_message(c["values_f32"], c["indices"])))
    for i, c in enumerate(v.get("decode_cases", [])):
        req = c["request"]
        out.append((f"decode_cases[{i}] ({req['scheme']}, d={req['d']})", req,
                    equal("values_f32", c["values_f32"], hexnorm)))
    for i, c in enumerate(v.get("refusal_cases", [])):
        out.append((f"refusal_cases[{i}] ({c['why']})", c["request"], refused()))
    return out


def run(vectors: dict[str, Any], command: list[str], timeout: float, verbose: bool) -> int:
    checks = build_checks(vectors)
    impl = Implementation(command, timeout)
    failed: list[str] = []
    try:
        for name, request, verdict in checks:
            reply = impl.ask(request)
            try:
                problem = verdict(reply)
            except (ValueError, TypeError, KeyError) as exc:
                problem = str(exc)
            if problem is not None:
                failed.append(name)
                print(f"FAIL {name}: {problem}")
            elif verbose:
                print(f"ok   {name}")
    except ImplementationError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        impl.close()
        return 2
    impl.close()
    groups = sorted({name.split("[")[0].split(".")[0] for name in failed})
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed"
          + (f"; failed in: {', '.join(groups)}" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Check an implementation of the rpsagg wire format against "
                    "docs/wire-vectors.json (protocol: conformance/README.md).")
    ap.add_argument("--vectors", type=Path, default=DEFAULT_VECTORS,
                    help="the vectors file (default: docs/wire-vectors.json)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds to wait for each reply (default 60)")
    ap.add_argument("--verbose", action="store_true", help="print every passed check too")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="the implementation's command line (after --)")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the implementation's command after --")
    vectors = json.loads(args.vectors.read_text(encoding="utf-8"))
    try:
        return run(vectors, command, args.timeout, args.verbose)
    except FileNotFoundError as exc:
        print(f"ERROR: cannot start the implementation: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
