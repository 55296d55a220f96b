"""``rpsagg-client --vectors``: reading the user's vectors (every format) and the one-line
errors for bad input, without a server (the service tests run the client against one)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from rpsagg_client.vectors import (
    ArraySource,
    StreamSource,
    VectorError,
    VectorsEnded,
    open_vectors,
)

pytestmark = pytest.mark.unit

D = 6


def _data(rounds: int, m: int = 1, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rounds, m, D))


def _csv(path: Path, rows: np.ndarray) -> Path:
    path.write_text("".join(",".join(repr(float(x)) for x in r) + "\n" for r in rows))
    return path


def test_npy_shapes_become_rounds_of_m_vectors(tmp_path: Path) -> None:
    x = _data(4, 2)
    for arr, rounds, m in ((x[0, 0], 1, 1), (x[:, 0], 4, 1), (x, 4, 2)):
        p = tmp_path / f"v{arr.ndim}.npy"
        np.save(p, arr)
        src = open_vectors(str(p))
        assert isinstance(src, ArraySource)
        assert (src.rounds, src.m, src.d) == (rounds, m, D)
        src.check_job(D, m, rounds, 0)
        for t in range(rounds):
            want = arr.reshape(rounds, m, D)[t]
            assert np.array_equal(src.vectors(t), want)
        with pytest.raises(VectorsEnded, match=f"ends after {rounds} round"):
            src.vectors(rounds)


def test_integer_npy_and_npz(tmp_path: Path) -> None:
    ints = np.arange(3 * D).reshape(3, D)
    np.save(tmp_path / "i.npy", ints)
    assert np.array_equal(open_vectors(str(tmp_path / "i.npy")).vectors(2), ints[2:3] * 1.0)
    x = _data(3)[:, 0]
    np.savez(tmp_path / "one.npz", whatever=x)
    np.savez(tmp_path / "named.npz", other=x * 2, vectors=x)
    np.savez(tmp_path / "two.npz", a=x, b=x)
    for name in ("one.npz", "named.npz"):
        assert np.array_equal(open_vectors(str(tmp_path / name)).vectors(1), x[1:2])
    with pytest.raises(VectorError, match=r"two\.npz: holds arrays a, b; name the one"):
        open_vectors(str(tmp_path / "two.npz"))


def test_csv_bit_identical_and_grouped_by_m(tmp_path: Path) -> None:
    x = _data(4)[:, 0]
    p = _csv(tmp_path / "v.csv", x)
    src = open_vectors(str(p))
    src.check_job(D, 1, 4, 0)
    assert all(np.array_equal(src.vectors(t)[0], x[t]) for t in range(4))  # repr round-trips
    grouped = open_vectors(str(p))
    grouped.check_job(D, 2, 2, 0)  # m = 2: two lines per round
    assert np.array_equal(grouped.vectors(1), x[2:4])
    with pytest.raises(VectorError, match=r"4 lines do not make whole rounds of m = 3"):
        open_vectors(str(p)).check_job(D, 3, 1, 0)
    # white space instead of commas, comments and blank lines
    q = tmp_path / "v.txt"
    q.write_text("# header\n\n1 2 3 4 5 6\n  7 8 9 10 11 12  \n")
    assert np.array_equal(open_vectors(str(q)).vectors(1)[0], np.arange(7.0, 13.0))


@pytest.mark.parametrize(("content", "message"), [
    ("1,2,3,4,5,6\n1,2,3,4,5\n", r"v\.csv line 2: 5 values; line 1 has 6 \(a short line\)$"),
    ("1,2,3,4,5,6\n\n# c\n1,2,x,4,5,6\n", r"v\.csv line 4: 'x' is not a number at index 2$"),
    ("1,2,3,4,5,6\n1,2,,4,5,6\n", r"v\.csv line 2: an empty field at index 2$"),
    ("1,2,3,nan,5,6\n", r"v\.csv line 1: nan at index 3; every value must be finite$"),
    ("1,2,3,4,5,6\n1,2,3,4,5,-inf\n", r"v\.csv line 2: -inf at index 5; every value"),
    ("# nothing\n\n", r"v\.csv: holds no vector"),
])
def test_csv_errors_name_the_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    p = tmp_path / "v.csv"
    p.write_text(content)
    with pytest.raises(VectorError, match=message) as err:
        open_vectors(str(p))
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(str(p))


def test_npy_errors_name_the_file_and_index(tmp_path: Path) -> None:
    x = _data(3)[:, 0]
    x[1, 4] = np.nan
    np.save(tmp_path / "nan.npy", x)
    with pytest.raises(VectorError, match=r"nan\.npy: nan at row 1, index 4; every value"):
        open_vectors(str(tmp_path / "nan.npy"))
    y = _data(2, 3)
    y[1, 2, 5] = np.inf
    np.save(tmp_path / "inf.npy", y)
    with pytest.raises(VectorError, match=r"inf\.npy: inf at round 1, vector 2, index 5"):
        open_vectors(str(tmp_path / "inf.npy"))
    # truncated: the header announces (3, 6) float64 = 144 bytes; cut 20 bytes of data off
    good = tmp_path / "good.npy"
    np.save(good, _data(3)[:, 0])
    cut = tmp_path / "cut.npy"
    cut.write_bytes(good.read_bytes()[:-20])
    with pytest.raises(VectorError, match=r"cut\.npy: truncated \.npy: the header announces "
                       r"shape \(3, 6\) \(144 bytes of data\) but the file holds 124; it ends "
                       r"at row 2, index 3$"):
        open_vectors(str(cut))
    (tmp_path / "junk.npy").write_bytes(b"not an npy file at all")
    with pytest.raises(VectorError, match=r"junk\.npy: not a readable \.npy file"):
        open_vectors(str(tmp_path / "junk.npy"))
    np.save(tmp_path / "c.npy", np.ones(D, dtype=complex))
    with pytest.raises(VectorError, match=r"c\.npy: holds complex128 values"):
        open_vectors(str(tmp_path / "c.npy"))
    np.save(tmp_path / "4d.npy", np.ones((1, 1, 1, D)))
    with pytest.raises(VectorError, match=r"4d\.npy: has shape \(1, 1, 1, 6\); expected"):
        open_vectors(str(tmp_path / "4d.npy"))
    with pytest.raises(VectorError, match=r"missing\.npy: no such file"):
        open_vectors(str(tmp_path / "missing.npy"))
    bad_zip = tmp_path / "bad.npz"
    with zipfile.ZipFile(bad_zip, "w") as z:
        z.writestr("vectors.npy", b"\x93NUMPY garbage")
    with pytest.raises(VectorError, match=r"bad\.npz: not a readable \.npz file"):
        open_vectors(str(bad_zip))


def test_job_checks(tmp_path: Path) -> None:
    np.save(tmp_path / "v.npy", _data(3)[:, 0])
    src = open_vectors(str(tmp_path / "v.npy"))
    with pytest.raises(VectorError, match=r"v\.npy: vectors of length 6; the server's d is 7$"):
        src.check_job(7, 1, 3, 0)
    with pytest.raises(VectorError, match=r"v\.npy: 1 vector\(s\) per round; the server's job "
                       r"takes m = 2"):
        src.check_job(D, 2, 3, 0)
    with pytest.raises(VectorError, match=r"v\.npy: ends after 3 round\(s\) of vectors, but the "
                       r"job runs 5 rounds$"):
        src.check_job(D, 1, 5, 0)
    with pytest.raises(VectorError, match=r"the job is at round step 4 already"):
        src.check_job(D, 1, 0, 3)
    src.check_job(D, 1, 0, 2)  # until stopped: the file's rounds, from step 2


def test_stream_reads_a_vector_per_new_step() -> None:
    x = _data(3)[:, 0]
    text = "".join(",".join(repr(float(v)) for v in r) + "\n" for r in x)
    src = open_vectors("-", io.StringIO("# from a pipe\n" + text))
    assert isinstance(src, StreamSource) and src.d == D
    src.check_job(D, 1, 0, 0)
    assert np.array_equal(src.vectors(0)[0], x[0])
    assert np.array_equal(src.vectors(0)[0], x[0])  # a failed round retried: the same vector
    assert np.array_equal(src.vectors(1)[0], x[1])
    assert np.array_equal(src.vectors(5)[0], x[2])  # the next line, whatever the step
    with pytest.raises(VectorsEnded, match=r"^<stdin>: ended after 3 vector\(s\)$"):
        src.vectors(6)


def test_stream_errors() -> None:
    with pytest.raises(VectorsEnded, match=r"<stdin>: ended after 0 vector"):
        open_vectors("-", io.StringIO(""))
    src = open_vectors("-", io.StringIO("1,2,3\n1,2\n"))
    with pytest.raises(VectorError, match=r"<stdin>: vectors of length 3; the server's d is 4"):
        src.check_job(4, 1, 0, 0)
    src.check_job(3, 1, 0, 0)
    src.vectors(0)
    with pytest.raises(VectorError, match=r"^<stdin> line 2: 2 values; expected d = 3 \(a short "
                       r"line\)$"):
        src.vectors(1)
    src = open_vectors("-", io.StringIO("1,2,3\n1,inf,3\n"))
    src.vectors(0)
    with pytest.raises(VectorError, match=r"^<stdin> line 2: inf at index 1; every value"):
        src.vectors(1)


def test_vectors_path_template() -> None:
    """``{replica}`` and ``{client_id}`` in --vectors (docker-compose.vectors.yml)."""
    from rpsagg_client.cli import vectors_path
    from rpsagg_client.vectors import VectorError

    assert vectors_path("/vectors/{replica}.npy", "proj-client-12") == "/vectors/12.npy"
    assert vectors_path("/v/{client_id}.csv", "alice") == "/v/alice.csv"
    assert vectors_path("plain.npy", "whatever") == "plain.npy"
    with pytest.raises(VectorError, match=r"\{replica\} needs a client id ending in -N"):
        vectors_path("/vectors/{replica}.npy", "alice")
