"""The user's own vectors end to end: ``rpsagg-server --task mean --data external`` and
``rpsagg-client --vectors`` processes on files this test writes, the estimate fetched over
real HTTP (``/api/rounds/{id}/estimate``) and with ``rpsagg-client result``.

Checks against the library and against the exact mean
-----------------------------------------------------
* Bit for bit: each round's estimate, in every format, equals ``Estimator.decode`` run in
  this process on the messages rebuilt from the committed submissions (client seed, values,
  round nonce; :func:`service_util.round_messages`).
* Statistically: the job runs ``--transform one``, whose MSE has a closed form
  (``docs/math.md``, "Sanity values"): with d a power of two and G_i G_i^T = I_k,
  client i's term ``(d/k) G_i^T G_i x_i - x_i`` is unbiased with
  ``E||.||^2 = (d/k)^2 (k/d) ||x_i||^2 - ||x_i||^2 = (d/k - 1) ||x_i||^2``, and the n terms
  are independent, so ``E||x_hat - x_bar||^2 = (1/n^2) (d/k - 1) sum_i ||x_i||^2 =: E_t``.
  The ratio ``r_t = ||x_hat_t - x_bar_t||^2 / E_t`` has mean 1; its standard deviation ``s``
  is measured on the same vectors with the library (fixed seeds, 400 trials). The client
  and the server draw their seeds and nonces at random, so over the job's R rounds the
  mean of ``r_t`` is within ``Z s / sqrt(R)`` of 1 with probability about ``1 - 2 Phi(-Z)``;
  Z = 5 (6e-7), so a wrong row, a wrong file or a wrong scale (all far outside) fails and
  chance does not.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest
from http_util import free_port
from service_util import base_config, in_process_server, round_messages, wait_until

from rpsagg import make_estimator
from rpsagg_experiments.launch import LocalJob, ServerProcess, client_command

pytestmark = pytest.mark.service

Z = 5.0


def get(url: str) -> tuple[bytes, dict[str, str]]:
    with urllib.request.urlopen(url, timeout=30) as res:
        return res.read(), {k.lower(): v for k, v in res.headers.items()}


def server(tmp_path: Path, http: int, *flags: str) -> ServerProcess:
    return ServerProcess([
        "--insecure", "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", str(http),
        "--http-host", "127.0.0.1", "--task", "mean", "--data", "external",
        "--db", str(tmp_path / "job.db"), "--drain", "5", *flags,
    ], tmp_path / "port", stderr=subprocess.PIPE)


def client(job: LocalJob, cid: str, vectors: str, stdin: int | None = None,
           quiet: bool = False) -> subprocess.Popen[bytes]:
    args = ["--server", job.target, "--client-id", cid, "--insecure", "--vectors", vectors]
    proc = subprocess.Popen(client_command(args + (["--quiet"] if quiet else [])),
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    job.clients.append(proc)
    return proc


def estimate(http: int, rid: int, fmt: str) -> tuple[np.ndarray, dict[str, Any]]:
    body, headers = get(f"http://127.0.0.1:{http}/api/rounds/{rid}/estimate?format={fmt}")
    if fmt == "npy":
        return np.load(io.BytesIO(body), allow_pickle=False), headers
    if fmt == "csv":
        rows = list(csv.reader(io.StringIO(body.decode())))
        assert len(rows) == 1
        return np.array(rows[0], dtype=np.float64), headers
    doc = json.loads(body)
    return np.array(doc["estimate"], dtype=np.float64), doc


def status(http: int) -> Any:
    return json.loads(get(f"http://127.0.0.1:{http}/api/status")[0])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint64), b.view(np.uint64)))


def library_decodes(db: Path, n: int, k: int, d: int, transform: str) -> dict[int, np.ndarray]:
    """Every done round's estimate decoded in this process from its stored messages."""
    est = make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform=transform)
    return {rid: est.decode(msgs) for rid, msgs in round_messages(str(db), est.name, k, d)}


def finish(proc: subprocess.Popen[bytes], timeout: float = 120) -> tuple[int, str, str]:
    if proc.stdin is not None and proc.stdin.closed:
        proc.stdin = None  # the test closed it (communicate would flush it)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode(), err.decode()


# -- three clients on three files ----------------------------------------------------------
N, K, D, ROUNDS = 3, 64, 1024, 16


def _files(tmp_path: Path) -> tuple[list[str], np.ndarray]:
    """Client i's vectors for every round: (ROUNDS, D) as .npy, .npz and CSV."""
    rng = np.random.default_rng(2027)
    common = rng.standard_normal(D)
    xs = np.stack([common + rng.standard_normal((ROUNDS, D)) for _ in range(N)])  # (N, R, D)
    paths = [tmp_path / "a.npy", tmp_path / "b.npz", tmp_path / "c.csv"]
    np.save(paths[0], xs[0])
    np.savez(paths[1], vectors=xs[1])
    with paths[2].open("w") as fp:
        for row in xs[2]:
            fp.write(",".join(repr(float(v)) for v in row) + "\n")
    return [str(p) for p in paths], xs


def _ratio_std(xs: np.ndarray, trials: int = 400) -> float:
    """The standard deviation of ||x_hat - x_bar||^2 / E_t for round 0's vectors (library,
    fixed seeds)."""
    est = make_estimator("rand-proj-spatial", n=N, k=K, d=D, transform="one")
    x = xs[:, 0]
    mean = x.mean(axis=0)
    expected = (D / K - 1) * float(np.sum(x * x)) / N**2
    ratios = []
    for t in range(trials):
        e = est.decode([est.encode(x[i], 10_000 + t * N + i) for i in range(N)]) - mean
        ratios.append(float(e @ e) / expected)
    assert abs(np.mean(ratios) - 1) <= Z * np.std(ratios) / np.sqrt(trials)  # the formula
    return float(np.std(ratios, ddof=1))


@pytest.mark.timeout(300)
def test_three_clients_files_estimate_over_http(tmp_path: Path) -> None:
    paths, xs = _files(tmp_path)
    http = free_port()
    job = LocalJob(server(tmp_path, http, "--n", str(N), "--k", str(K), "--d", str(D),
                          "--rounds", str(ROUNDS), "--transform", "one", "--linger", "-1",
                          "--round-timeout", "120"))
    fetched: dict[int, np.ndarray] = {}
    with job:
        procs = [client(job, f"c{i}", p) for i, p in enumerate(paths)]
        for p in procs:
            rc, out, err = finish(p)
            assert rc == 0, err
            assert len([ln for ln in out.splitlines() if "round done with 3/3" in ln]) == ROUNDS
        wait_until(lambda: status(http)["job"]["done"], 60, "the job's end")
        for rid in range(1, ROUNDS + 1):
            got, doc = estimate(http, rid, "json")
            assert (doc["n_prime"], doc["k"], doc["d"], doc["scheme"], doc["transform"]) == (
                N, K, D, "rand-proj-spatial", "one")
            assert doc["bytes"]["wire"] > 0 and sorted(doc["contributors"]) == ["c0", "c1", "c2"]
            for fmt in ("csv", "npy"):
                other, headers = estimate(http, rid, fmt)
                assert same_bits(other, got), (rid, fmt)
                assert headers["x-rpsagg-n-prime"] == str(N)
            fetched[rid] = got
        # rpsagg-client result: the same bits, round N and the latest (0)
        for rid, name in ((5, "r5.npy"), (0, "last.npy")):
            res = subprocess.run(client_command(
                ["result", "--server", job.target, "--insecure", "--round", str(rid),
                 "--out", str(tmp_path / name)]), capture_output=True, text=True, timeout=60)
            assert res.returncode == 0, res.stderr
            want = fetched[rid or ROUNDS]
            assert same_bits(np.load(tmp_path / name), want)
            assert f"the mean of {N} of {N} clients' vectors" in res.stdout
    decoded = library_decodes(tmp_path / "job.db", N, K, D, "one")
    assert sorted(decoded) == list(range(1, ROUNDS + 1))
    ratios = []
    for rid, got in fetched.items():
        assert same_bits(got, decoded[rid][0] if decoded[rid].ndim == 2 else decoded[rid])
        x = xs[:, rid - 1]  # round r is task step r - 1: row r - 1 of every file
        e = got - x.mean(axis=0)
        ratios.append(float(e @ e) / ((D / K - 1) * float(np.sum(x * x)) / N**2))
    s = _ratio_std(xs)
    assert abs(np.mean(ratios) - 1.0) <= Z * s / np.sqrt(ROUNDS), (np.mean(ratios), s)


# -- a stream on standard input ------------------------------------------------------------
def _line(v: np.ndarray) -> bytes:
    return (",".join(repr(float(x)) for x in v) + "\n").encode()


def _feed(stdin: IO[bytes] | None, v: np.ndarray) -> None:
    assert stdin is not None
    stdin.write(_line(v))
    stdin.flush()


@pytest.mark.timeout(300)
def test_stdin_client_takes_part_in_a_round_per_vector(tmp_path: Path) -> None:
    rounds, d, k = 20, 64, 16
    rng = np.random.default_rng(3)
    stream, other = rng.standard_normal((rounds, d)), rng.standard_normal((rounds, d))
    np.save(tmp_path / "other.npy", other)
    http = free_port()
    job = LocalJob(server(tmp_path, http, "--n", "2", "--k", str(k), "--d", str(d),
                          "--rounds", str(rounds), "--linger", "-1", "--round-timeout", "120",
                          "--transform", "one"))
    with job:
        piped = client(job, "piped", "-", stdin=subprocess.PIPE)
        _feed(piped.stdin, stream[0])  # d comes from the first line, before it joins
        filed = client(job, "filed", str(tmp_path / "other.npy"))
        for t in range(1, rounds):  # the next vector once the previous round is done
            wait_until(lambda t=t: (status(http)["job"] or {}).get("steps_done", 0) >= t, 60,
                       f"round {t}")
            _feed(piped.stdin, stream[t])
        assert piped.stdin is not None
        piped.stdin.close()
        rc, out, err = finish(piped)
        assert rc == 0, err
        assert len([ln for ln in out.splitlines() if "round done with 2/2" in ln]) == rounds
        assert finish(filed)[0] == 0
        wait_until(lambda: status(http)["job"]["done"], 60, "the job's end")
        rows = json.loads(get(f"http://127.0.0.1:{http}/api/rounds?limit=100")[0])["rounds"]
        assert len(rows) == rounds
        assert all(r["state"] == "done" and "piped" in r["clients"]["arrived"] for r in rows)
        fetched = {rid: estimate(http, rid, "npy")[0] for rid in range(1, rounds + 1)}
    decoded = library_decodes(tmp_path / "job.db", 2, k, d, "one")
    for rid, got in fetched.items():
        assert same_bits(got, decoded[rid])
    # the stream's line t went to round t + 1: the library on those vectors, the same seeds
    # (the mean of both clients' row t; a shifted stream would be ~(d/k) times further off)
    errs = [float(np.sum((fetched[t + 1] - (stream[t] + other[t]) / 2) ** 2))
            / ((d / k - 1) * float(np.sum(stream[t] ** 2) + np.sum(other[t] ** 2)) / 4)
            for t in range(rounds)]
    assert 0.3 < float(np.mean(errs)) < 3.0, errs


@pytest.mark.timeout(300)
def test_a_stream_that_ends_early_leaves_the_job_finishing_without_it(tmp_path: Path) -> None:
    rounds, d, k, fed, timeout = 5, 32, 8, 2, 3.0
    rng = np.random.default_rng(4)
    np.save(tmp_path / "full.npy", rng.standard_normal((rounds, d)))
    http = free_port()
    job = LocalJob(server(tmp_path, http, "--n", "2", "--k", str(k), "--d", str(d),
                          "--rounds", str(rounds), "--round-timeout", str(timeout),
                          "--linger", "-1"))
    with job:
        short = client(job, "short", "-", stdin=subprocess.PIPE)
        assert short.stdin is not None
        short.stdin.write(b"".join(_line(v) for v in rng.standard_normal((fed, d))))
        short.stdin.close()  # the stream ends after 2 vectors
        full = client(job, "full", str(tmp_path / "full.npy"))
        rc, _, err = finish(short)
        assert rc == 2
        assert err.strip().splitlines() == [
            f"rpsagg-client: <stdin>: ended after {fed} vector(s), but the job runs {rounds} "
            "rounds; leaving it"]
        assert finish(full)[0] == 0
        wait_until(lambda: status(http)["job"]["done"], 60, "the job's end")
        st = status(http)
        assert st["job"]["state"] == "done" and st["job"]["steps_done"] == rounds
        with_short = []
        for rid in range(1, rounds + 1):
            r = json.loads(get(f"http://127.0.0.1:{http}/api/rounds/{rid}")[0])
            assert r["state"] == "done"
            _, doc = estimate(http, rid, "json")
            if doc["n_prime"] == 2:
                with_short.append(rid)
            else:  # closed at the deadline with the one client left
                assert doc["n_prime"] == 1 and r["clients"]["missing"] == ["short"]
                closed, first = r["timestamps"]["closed"], r["timestamps"]["first_submission"]
                assert closed - first >= timeout - 0.1
        # one vector per round it took part in: all `fed` of them unless its first one came
        # after round 1's deadline (a slow start); then nothing more
        assert 1 <= len(with_short) <= fed and with_short[-1] <= fed + 1, with_short


# -- bad input -------------------------------------------------------------------------------
def _bad_inputs(tmp_path: Path, d: int) -> list[tuple[str, bytes | None, str]]:
    """(the --vectors argument, stdin, the one line expected on stderr)."""
    rng = np.random.default_rng(5)
    wrong_d = tmp_path / "wrong_d.npy"
    np.save(wrong_d, rng.standard_normal((3, d + 1)))
    nan = tmp_path / "nan.npy"
    x = rng.standard_normal((3, d))
    x[2, 5] = np.nan
    np.save(nan, x)
    good = tmp_path / "good.npy"
    np.save(good, rng.standard_normal((3, d)))
    cut = tmp_path / "cut.npy"
    cut.write_bytes(good.read_bytes()[:-8 * (2 * d - 3)])  # d + 3 values: 3 into row 1
    short = tmp_path / "short.csv"
    short.write_text("".join(",".join(["1.5"] * n) + "\n" for n in (d, d, d - 1)))
    nan_csv = tmp_path / "nan.csv"
    nan_csv.write_text(",".join(["1"] * d) + "\n" + ",".join(["1"] * (d - 1) + ["nan"]) + "\n")
    few = tmp_path / "few.npy"
    np.save(few, rng.standard_normal((2, d)))
    huge = tmp_path / "huge.npy"  # finite, beyond float32
    x = rng.standard_normal((3, d))
    x[1, 2] = 1e308
    np.save(huge, x)
    wide = tmp_path / "wide.npy"  # float32 values whose vector's norm is beyond float32
    np.save(wide, np.full((3, d), 3e38, dtype=np.float32))
    norm = float(np.sqrt(d * np.float64(np.float32(3e38)) ** 2))
    npz_txt = tmp_path / "text_member.npz"
    with zipfile.ZipFile(npz_txt, "w") as z:
        z.writestr("vectors.txt", "1,2,3\n")
    npz_odd = tmp_path / "odd_compression.npz"
    buf = io.BytesIO()
    np.save(buf, rng.standard_normal((3, d)))
    with zipfile.ZipFile(npz_odd, "w") as z:
        z.writestr("vectors.npy", buf.getvalue())
    raw = bytearray(npz_odd.read_bytes())  # compression method 99 (AES), which zipfile lacks
    raw[8:10] = (99).to_bytes(2, "little")
    cd = raw.rfind(b"PK\x01\x02")
    raw[cd + 10:cd + 12] = (99).to_bytes(2, "little")
    npz_odd.write_bytes(bytes(raw))
    csvs = {}
    for tag, field in (("underscore", "1_000"), ("fullwidth", "\uff11"),
                       ("arabic_indic", "\u0663")):
        csvs[tag] = tmp_path / f"{tag}.csv"
        csvs[tag].write_text(",".join(["1"] * (d - 1) + [field]) + "\n", encoding="utf-8")
    head = "rpsagg-client: "
    data = 8 * 3 * d
    ascii_only = "(numbers are written in ASCII, e.g. 1000, -0.5, 1e-3)"
    f32 = "float32's largest finite value 3.4028235e+38"
    return [
        (str(huge), None, f"{head}{huge}: at row 1, index 2, 1e+308 is beyond {f32} (values "
         "are sent as float32)"),
        (str(wide), None, f"{head}{wide}, row 0: the vector's norm {norm:g} is beyond {f32} "
         "(a rotation can put all of it in one sent float32 value); scale the vectors down"),
        (str(npz_txt), None, f"{head}{npz_txt}: its member 'vectors.txt' is not an .npy "
         "array (an .npz holds .npy files, as numpy.savez writes them)"),
        (str(npz_odd), None, f"{head}{npz_odd}: not a readable .npz file (That compression "
         "method is not supported)"),
        *((str(p), None, f"{head}{p} line 1: {f!r} is not a number at index {d - 1} "
           f"{ascii_only}") for p, f in zip(csvs.values(), ("1_000", "\uff11", "\u0663"),
                                            strict=True)),
        (str(wrong_d), None, f"{head}{wrong_d}: vectors of length {d + 1}; the server's d "
         f"is {d}"),
        (str(nan), None, f"{head}{nan}: nan at row 2, index 5; every value must be finite"),
        (str(cut), None, f"{head}{cut}: truncated .npy: the header announces shape (3, {d}) "
         f"({data} bytes of data) but the file holds {8 * (d + 3)}; it ends at row 1, "
         "index 3"),
        (str(short), None, f"{head}{short} line 3: {d - 1} values; line 1 has {d} (a short "
         "line)"),
        (str(nan_csv), None, f"{head}{nan_csv} line 2: nan at index {d - 1}; every value "
         "must be finite"),
        ("-", _line(np.ones(d - 2)), f"{head}<stdin>: vectors of length {d - 2}; the server's "
         f"d is {d}"),
        (str(few), None, f"{head}{few}: ends after 2 round(s) of vectors, but the job runs 3 "
         "rounds"),
    ]


@pytest.mark.timeout(300)
def test_bad_input_is_one_line_and_nothing_is_sent(tmp_path: Path) -> None:
    d = 16
    http = free_port()
    job = LocalJob(server(tmp_path, http, "--n", "2", "--k", "4", "--d", str(d), "--rounds",
                          "3", "--linger", "-1"))
    with job:
        for arg, stdin, line in _bad_inputs(tmp_path, d):
            proc = client(job, "bad", arg, stdin=subprocess.PIPE if stdin else None)
            if stdin:
                assert proc.stdin is not None
                proc.stdin.write(stdin)
                proc.stdin.close()
            rc, out, err = finish(proc, 60)
            assert (rc, out, err.splitlines()) == (2, "", [line]), arg
        # a 200 KB .npy header: numpy's refusal, on one line
        big = tmp_path / "big_header.npy"
        header = (f"{{'descr': '<f8', 'fortran_order': False, 'shape': (3, {d}), }}"
                  + " " * 200_000 + "\n").encode()
        big.write_bytes(b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header
                        + np.ones(3 * d).tobytes())
        rc, out, err = finish(client(job, "bad", str(big)), 60)
        assert (rc, out, len(err.splitlines())) == (2, "", 1), err
        assert err.startswith(f"rpsagg-client: {big}: not a readable .npy file (Header info "
                              "length (200"), err
        st = status(http)
        assert st["clients_joined"] == 0 and st["clients"] == []
        assert st["current_round"]["state"] == "open"
        assert st["current_round"]["clients"]["arrived"] == []
        metrics = get(f"http://127.0.0.1:{http}/metrics")[0].decode()
        refused = [ln for ln in metrics.splitlines()
                   if ln.startswith("rpsagg_submissions") and not ln.endswith(" 0.0")]
        assert refused == [], refused  # not one Submit reached the server
    conn = sqlite3.connect(tmp_path / "job.db")
    try:
        assert conn.execute("SELECT COUNT(*) FROM submissions").fetchone() == (0,)
        assert conn.execute("SELECT COUNT(*) FROM clients").fetchone() == (0,)
    finally:
        conn.close()


# -- until stopped ---------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_until_stopped_job_ends_cleanly_on_sigterm(tmp_path: Path) -> None:
    d, k = 16, 4
    rng = np.random.default_rng(6)
    for name in ("a", "b"):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal((100_000, d)))
    http = free_port()
    job = LocalJob(server(tmp_path, http, "--n", "2", "--k", str(k), "--d", str(d),
                          "--rounds", "0", "--linger", "0", "--round-timeout", "60"))
    with job:
        procs = [client(job, c, str(tmp_path / f"{c}.npy"), quiet=True) for c in ("a", "b")]
        wait_until(lambda: (status(http)["job"] or {}).get("steps_done", 0) >= 3, 60,
                   "three rounds")
        assert status(http)["job"]["rounds_planned"] == 0
        srv = job.server.proc
        assert srv is not None
        srv.send_signal(signal.SIGTERM)  # ends the job after the current round
        for p in procs:
            rc, _, err = finish(p)
            assert rc == 0, err
        _, err = srv.communicate(timeout=60)
        assert srv.returncode == 0, err.decode()[-2000:]
        assert "ending the job after the current round" in err.decode()
        assert "job end drained: all 2 joined clients were told" in err.decode()
    conn = sqlite3.connect(tmp_path / "job.db")
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        states = [s for (s,) in conn.execute("SELECT state FROM rounds ORDER BY round_id")]
        last = conn.execute("SELECT state, reason FROM rounds ORDER BY round_id DESC LIMIT 1"
                            ).fetchone()
    finally:
        conn.close()
    assert meta["job_done"] == "1" and meta.get("job_failure", "") == ""
    assert len(states) >= 3 and set(states[:-1]) == {"done"}
    assert last[0] == "done" or "the job was stopped" in last[1], last


def test_a_client_without_vectors_is_told_to_pass_them(tmp_path: Path) -> None:
    http = free_port()
    job = LocalJob(server(tmp_path, http, "--n", "1", "--k", "4", "--d", "8", "--rounds", "1",
                          "--linger", "-1"))
    with job:
        args = ["--server", job.target, "--client-id", "x", "--insecure"]
        proc = job.start_client(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 2
        assert err.decode().splitlines() == [
            "rpsagg-client: the server's job averages the clients' own vectors: pass "
            "--vectors PATH (or set RPSAGG_VECTORS)"]
        # RPSAGG_VECTORS is --vectors' twin: the same client from the environment
        np.save(tmp_path / "v.npy", np.ones(8))
        env = {**os.environ, "RPSAGG_VECTORS": str(tmp_path / "v.npy")}
        proc = job.start_client(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        assert "round done with 1/1 clients" in out.decode()


def test_no_estimate_yet_over_http_and_from_the_result_command(tmp_path: Path) -> None:
    http = free_port()
    job = LocalJob(server(tmp_path, http, "--n", "1", "--k", "4", "--d", "8", "--rounds", "1",
                          "--linger", "-1"))
    with job:
        with pytest.raises(urllib.error.HTTPError) as err:
            get(f"http://127.0.0.1:{http}/api/rounds/1/estimate")
        assert err.value.code == 409
        with pytest.raises(urllib.error.HTTPError) as err:
            get(f"http://127.0.0.1:{http}/api/rounds/2/estimate?format=npy")
        assert err.value.code == 404
        base = ["result", "--server", job.target, "--insecure", "--round", "1"]
        for extra, rc, line in [
            (["--out", str(tmp_path / "r.npy")], 1,
             "rpsagg-client: round 1 is open; it has no estimate yet (--wait waits for it)"),
            (["--out", str(tmp_path / "r.csv")], 2,
             f"rpsagg-client: --out {tmp_path / 'r.csv'}: the estimate is written as .npy; "
             "name the file FILE.npy"),
        ]:
            res = subprocess.run(client_command(base + extra), capture_output=True, text=True,
                                 timeout=60)
            assert (res.returncode, res.stderr.splitlines()) == (rc, [line])
        assert not (tmp_path / "r.npy").exists()


@pytest.mark.timeout(180)
def test_until_stopped_with_a_stream_that_ends(tmp_path: Path) -> None:
    """A stream client in a job until stopped leaves it when its input ends (exit 0); the
    job goes on until SIGTERM, which fails the open round (nothing to decode) and ends the
    job as done."""
    d = 8
    http = free_port()
    job = LocalJob(server(tmp_path, http, "--n", "1", "--k", "4", "--d", str(d), "--rounds",
                          "0", "--linger", "0", "--drain", "1"))
    with job:
        piped = client(job, "piped", "-", stdin=subprocess.PIPE)
        assert piped.stdin is not None
        piped.stdin.write(_line(np.ones(d)) + _line(np.arange(d, dtype=float)))
        piped.stdin.close()
        rc, out, err = finish(piped)
        assert (rc, err.splitlines()) == (0, [
            "rpsagg-client: <stdin>: ended after 2 vector(s); leaving the job"])
        assert len(out.splitlines()) == 2
        st = status(http)
        assert st["job"]["steps_done"] == 2 and not st["job"]["done"]
        assert st["current_round"]["round_id"] == 3
        srv = job.server.proc
        assert srv is not None
        srv.send_signal(signal.SIGTERM)
        _, log = srv.communicate(timeout=60)
        assert srv.returncode == 0, log.decode()[-2000:]
    conn = sqlite3.connect(tmp_path / "job.db")
    try:
        rows = conn.execute("SELECT round_id, state, reason FROM rounds ORDER BY round_id"
                            ).fetchall()
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    finally:
        conn.close()
    assert rows == [(1, "done", ""), (2, "done", ""), (
        3, "failed", "the job was stopped: 0 of the minimum 1 clients submitted")]
    assert meta["job_done"] == "1" and meta.get("job_failure", "") == ""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("submitted", [0, 1])
def test_stop_job_closes_the_current_round_and_ends_the_job(tmp_path: Path,
                                                            submitted: int) -> None:
    """--rounds 0 stopped with the round open (it fails: nothing to decode) or collecting
    (it decodes what arrived, n' = 1 of 2); either way the job is done, not failed, and a
    restart on the database finds it done."""
    from rpsagg_client import AggregationClient

    cfg = base_config(db=str(tmp_path / "job.db"), n=2, k=4, d=8, rounds=0, data="external")
    with in_process_server(cfg) as srv:
        engine = srv.running.engine
        with AggregationClient(f"127.0.0.1:{srv.port}", "a", insecure=True) as a:
            a.join()
            rnd = a.current_round()
            assert rnd.total_rounds == 0
            if submitted:
                a.submit(rnd, np.arange(8.0))
            srv.loop.call_soon_threadsafe(engine.stop_job)
            res = a.result(rnd.round_id, wait=True)
            assert res.job_done
            if submitted:
                assert (res.state, res.n_prime) == ("done", 1)
            else:
                assert res.state == "failed"
                assert res.reason == ("the job was stopped: 0 of the minimum 1 clients "
                                      "submitted")
            info = a.current_round()
            assert info.job_done and info.job_failure == ""
        job = srv.running.state.job()
        assert job is not None and job.state == "done" and job.rounds_planned == 0
    with in_process_server(cfg) as srv:
        assert srv.running.engine.job_done and srv.running.engine.progress.job_failure == ""


def test_server_flags_of_external_jobs() -> None:
    from rpsagg_server.settings.flags import load_config

    base = ["--insecure", "--task", "mean"]
    cfg = load_config([*base, "--data", "external", "--rounds", "0", "--mean-vectors", "3"])
    assert (cfg.data, cfg.rounds, cfg.params["vectors"]) == ("external", 0, 3.0)
    assert load_config([*base, "--data", "external", "--d", "0", "--k", "500"]).d == 0
    for argv, message in [
        (["--rounds", "-1"], "--rounds must be >= 0 (0: until stopped); got -1"),
        (["--data", "mine"], "--data must be one of synthetic, fashion-mnist, ujiindoorloc, "
         "external; got 'mine'"),
        (["--data", "external", "--task", "kmeans"], "--data external (the clients' own "
         "vectors) goes with --task mean; got --task kmeans"),
        (["--mean-vectors", "0"], "--mean-vectors must be >= 1; got 0"),
        (["--mean-vectors", "2", "--task", "linreg"], "--mean-vectors applies to --task mean"),
        (["--d", "0"], "--d 0 (d from the first client's join) goes with --data external"),
        (["--d", "-3", "--data", "external"], "--d must be >= 1 (or 0 with --data external: "
         "from the first client's join); got -3"),
    ]:
        with pytest.raises(ValueError) as err:
            load_config([*base, *argv])
        assert str(err.value) == message


def _status_or_none(http: int) -> Any:
    try:
        return status(http)
    except (urllib.error.URLError, ConnectionError):
        return None  # the dashboard starts with the job, once d is known


@pytest.mark.timeout(300)
def test_d_from_the_first_join(tmp_path: Path) -> None:
    """``--d 0``: GetRound says d = 0 until a join says d; a join without d or with d < k is
    refused; the first join with d fixes it (durably: a restart keeps it); a client whose
    vectors have another d is then refused before it joins."""
    import grpc

    from rpsagg_client import AggregationClient

    d, k = 48, 8
    rng = np.random.default_rng(9)
    np.save(tmp_path / "b.npy", rng.standard_normal((2, d)))
    np.save(tmp_path / "wrong.npy", rng.standard_normal((2, d + 1)))
    http = free_port()
    flags = ("--n", "2", "--k", str(k), "--d", "0", "--rounds", "2", "--linger", "-1",
             "--round-timeout", "120")
    job = LocalJob(server(tmp_path, http, *flags))
    with job, AggregationClient(job.target, "a", insecure=True, retry_budget=30) as a:
        info = a.current_round()
        assert (info.d, info.round_id, info.state, info.total_rounds) == (0, 0, "unspecified", 2)
        with pytest.raises(grpc.RpcError) as err:
            a.join()
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "takes d from the first client's join" in str(err.value.details())
        with pytest.raises(grpc.RpcError) as err:
            a.join(d=k - 1)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == f"d = {k - 1} (client 'a') is below the job's k = {k}"
        joined = a.join(d=d)  # answered UNAVAILABLE while the job starts, retried
        assert joined.client_index == 0
        wait_until(lambda: (_status_or_none(http) or {}).get("config", {}).get("d") == d, 30,
                   "the dashboard with d")
        wrong = client(job, "w", str(tmp_path / "wrong.npy"))
        assert finish(wrong, 60)[0::2] == (2, f"rpsagg-client: {tmp_path / 'wrong.npy'}: "
                                              f"vectors of length {d + 1}; the server's d is "
                                              f"{d}\n")
        with pytest.raises(grpc.RpcError) as err:
            AggregationClient(job.target, "w2", insecure=True).join(d=d + 1)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == f"client 'w2' has vectors of length {d + 1}; this " \
            f"job's d is {d}"
        b = client(job, "b", str(tmp_path / "b.npy"))
        xa = rng.standard_normal((2, d))
        for t in range(2):
            rnd = a.current_round()
            a.submit(rnd, xa[t])
            assert a.result(rnd.round_id, wait=True).state == "done"
        assert finish(b)[0] == 0
        assert [c["client_id"] for c in status(http)["clients"]] == ["a", "b"]
        got = {rid: estimate(http, rid, "npy")[0] for rid in (1, 2)}
        assert all(v.shape == (d,) for v in got.values())
    decoded = library_decodes(tmp_path / "job.db", 2, k, d, "avg")
    assert all(same_bits(got[rid], decoded[rid]) for rid in (1, 2))
    # a restart on the database starts the job at once with the d it learned
    (tmp_path / "port").unlink()
    again = LocalJob(server(tmp_path, http, *flags))
    with again:
        st = status(http)
        assert st["config"]["d"] == d and st["job"]["done"]


@pytest.mark.timeout(120)
def test_d_from_the_first_join_keeps_tls_and_tokens(tmp_path: Path) -> None:
    """The stand-in that waits for d serves with the job's TLS and tokens: a join without a
    token is UNAUTHENTICATED (and fixes nothing); one with a token fixes d."""
    import grpc
    from service_util import make_certs

    from rpsagg_client import AggregationClient

    certs = make_certs(tmp_path)
    (tmp_path / "tokens.txt").write_text("s3cret\n")
    srv = ServerProcess([
        "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", "0", "--task", "mean",
        "--data", "external", "--d", "0", "--n", "1", "--k", "4", "--rounds", "1",
        "--db", ":memory:", "--linger", "-1", "--tls-cert", certs.server_cert,
        "--tls-key", certs.server_key, "--tokens", str(tmp_path / "tokens.txt"),
    ], tmp_path / "port", stderr=subprocess.PIPE)
    with srv:
        with AggregationClient(srv.target, "x", tls_ca=certs.ca) as anon, \
                pytest.raises(grpc.RpcError) as err:
            anon.join(d=8)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with AggregationClient(srv.target, "a", token="s3cret", tls_ca=certs.ca) as a:
            assert a.current_round().d == 0
            assert a.join(d=8).client_index == 0
            assert a.current_round().d == 8
