"""The README and the documentation site: the README's library quick start runs, the simulation
command works, every local link resolves, every page of docs/ is in the site's navigation, and
the pages are reference, not a work log (no issue numbers, no numbered work periods)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from repo_paths import ROOT

pytestmark = pytest.mark.unit



def test_readme_opens_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block is not None and text.index("```bash") < text.index("\n## ")
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["./run.sh", "./test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./test.sh" in ci


def test_run_sh_answers_help_and_version_without_setting_up() -> None:
    # with .venv in place: the cluster's own help, and no set-up line before it
    for flag, first in (("--help", "usage: rpsagg-cluster"), ("--version", "rpsagg-cluster ")):
        out = subprocess.run([str(ROOT / "run.sh"), "--n", "3", flag], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith(first), out
        assert "[setup]" not in out.stdout + out.stderr


def test_readme_quick_start_prints_what_the_readme_shows() -> None:
    """The quick start's output is the block beside it, to the printed digit (fixed seeds),
    and it shows the gain it claims: Rand-Proj-Spatial below Rand-k at each k."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Library quick start") :]
    code = re.search(r"```python\n(.*?)```\n\n```text\n(.*?)```", section, re.S)
    assert code is not None
    out = subprocess.run(
        [sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == code.group(2)
    errors = {(k, name): float(err) for k, name, err in
              re.findall(r"k = +(\d+) +(\S+) +relative error (\S+)", out.stdout)}
    for k in ("32", "128"):
        assert errors[(k, "rand-proj-spatial")] < errors[(k, "rand-k-spatial")] \
            < errors[(k, "rand-k")]


def test_simulation_command_prints_every_estimator() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rpsagg.simulate",
            "--n",
            "3",
            "--k",
            "4",
            "--d",
            "32",
            "--trials",
            "3",
            "--r",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for name in ("rand-k ", "rand-k-spatial", "rand-proj-spatial", "rand-k-wangni", "induced"):
        assert name in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "rpsagg.simulate", "--n", "3", "--k", "40", "--d", "32"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "k must be in [1, d]" in bad.stderr


def test_the_libraries_simulate_example_runs_as_written() -> None:
    """docs/library.md's rpsagg-simulate line, and the ratios its text quotes from it."""
    text = (ROOT / "docs" / "library.md").read_text()
    block = re.search(r"```bash\n(rpsagg-simulate .*?)\n```", text)
    assert block is not None
    argv = block.group(1).split()
    out = subprocess.run([str(Path(sys.executable).parent / argv[0]), *argv[1:]],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    mse = {(r, name, t): float(v) for r, name, t, v in
           re.findall(r"R=(\S+) +(\S+) +(\S+) +MSE +(\S+)", out.stdout)}
    rand_k = mse[("9", "rand-k", "-")]
    quoted = re.search(r"Rand-Proj-Spatial\(max\) has (\S+)x\nRand-k's error \((\S+) against "
                       r"(\S+) with `--trials 50`.*?\(avg\) (\S+)x", text, re.S)
    assert quoted is not None
    ratio_max, max_mse, k_mse, ratio_avg = (float(g) for g in quoted.groups())
    assert (round(mse[("9", "rand-proj-spatial", "max")], 2), round(rand_k, 2)) == (max_mse, k_mse)
    assert round(mse[("9", "rand-proj-spatial", "max")] / rand_k, 2) == ratio_max
    assert round(mse[("9", "rand-proj-spatial", "avg")] / rand_k, 2) == ratio_avg


# files of the site that the build generates (scripts/mkdocs_hooks.py), not in the repository
GENERATED = {ROOT / "docs" / "reference" / "openapi.json"}


def test_every_local_link_and_image_in_the_docs_exists() -> None:
    # Markdown links and images ](path) in README.md, CHANGELOG.md and docs/**/*.md that are
    # not URLs or anchors must name files of the repository (relative to the document).
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "#", "mailto:")):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists() and path not in GENERATED:
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, missing


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def test_every_docs_page_is_in_the_site_navigation() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = _nav_pages(config["nav"])
    pages = sorted([*(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob(
        "*.md")), "changelog.md"])  # CHANGELOG.md, generated into the site by its hooks
    assert sorted(set(listed)) == pages, set(pages) ^ set(listed)


# Python examples of README.md and docs/ that name what only a real deployment has (a server's
# address and token, Flower's grid, a GPU, files made by a walk-through); each by its page and
# first line. Every other Python block of those pages runs as it is written.
PLACEHOLDER_EXAMPLES = {
    ("README.md", "from rpsagg_client import AggregationClient"),  # HOST, TOKEN, my_vector
    ("README.md", "from flwr.clientapp import ClientApp"),  # flwr: in .venv-flower
    ("docs/vectors.md", "from rpsagg_client import AggregationClient"),
    ("docs/vectors.md", "import numpy as np"),  # the walk-through's x*.npy and mean.npy
    ("docs/flower-start.md", "from flwr.clientapp import ClientApp"),
    ("docs/flower.md", "app = ClientApp(mods=client_mods(fixedclipping_mod))     # or "
     "adaptiveclipping_mod"),
    ("docs/flower.md", "app = ClientApp(mods=[make_rpsagg_mod(clipping_inside=True)])"),
    ("docs/scaling.md", 'est = rpsagg.make_estimator("rand-proj-spatial", n=100, k=1024, '
     'd=2**20, device="cuda")'),  # a GPU, and msgs
}


def _python_examples() -> list[tuple[str, str, str]]:
    out = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        rel = page.relative_to(ROOT).as_posix()
        for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            out.append((rel, block.splitlines()[0].strip(), block))
    return out


def test_every_python_example_runs_or_is_a_named_placeholder(tmp_path: Path) -> None:
    examples = _python_examples()
    named = {(page, first) for page, first, _ in examples}
    assert not PLACEHOLDER_EXAMPLES - named, PLACEHOLDER_EXAMPLES - named  # none stale
    ran = 0
    for page, first, code in examples:
        if (page, first) in PLACEHOLDER_EXAMPLES:
            continue
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
        assert out.returncode == 0, (page, first, out.stderr)
        ran += 1
    assert ran >= 2  # the README's quick start and docs/library.md's at least


def test_docs_name_no_commit_of_the_repository() -> None:
    """A page describes the system as it is; which commit did what is git's and the
    CHANGELOG's. Every hex word of 7 to 40 digits in the README, the docs and the examples'
    READMEs is looked up among the repository's objects: none may be a commit (hex dumps
    and golden vectors are not)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted(ROOT.glob("examples/*/README.md"))]
    words = sorted({(word, page.relative_to(ROOT).as_posix()) for page in pages
                    for word in re.findall(r"\b[0-9a-f]{7,40}\b", page.read_text())})
    assert words  # the scan sees the hex of the wire-format page
    found = subprocess.run(["git", "cat-file", "--batch-check"], cwd=ROOT, text=True,
                           input="".join(f"{w}\n" for w, _ in words), capture_output=True,
                           timeout=60, check=True).stdout.splitlines()
    commits = [where for where, line in zip(words, found, strict=True)
               if line.split()[1:2] == ["commit"]]
    assert not commits, commits


# Work-log words: an issue's number, a numbered work period. The docs describe the system as it
# is; what changed and when is CHANGELOG.md's.
DIARY = re.compile(r"\b(?:issues?|sessions?|work periods?|sprints?)\s+#?\d+", re.I)


def test_docs_name_no_issue_numbers_or_work_periods() -> None:
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        rel = page.relative_to(ROOT / "docs").as_posix() if page.parent != ROOT else page.name
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{rel}:{number}: {m.group(0)}" for m in DIARY.finditer(line)]
    assert not found, found


CODE_DIRS = ("common", "wire", "server", "client", "flower", "experiments", "bench", "scripts",
             "conformance", "examples", "docker", "proto")


def test_code_comments_name_no_issue_numbers_or_work_periods() -> None:
    found = []
    for top in CODE_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in {".py", ".c", ".h", ".sh", ".proto", ".yml", ".yaml",
                                   ".toml", ".md"} or not path.is_file():
                continue
            rel = path.relative_to(ROOT).as_posix()
            if "/_pb2" in rel or "_pb2" in path.name:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8",
                                                         errors="replace").splitlines(), 1):
                found += [f"{rel}:{number}: {m.group(0)}" for m in DIARY.finditer(line)]
    tests = [p for p in sorted((ROOT / "tests").rglob("*.py")) if p.name != "test_docs.py"]
    for path in tests:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {m.group(0)}"
                      for m in DIARY.finditer(line)]
    assert not found, found


def test_the_diary_pattern_catches_what_it_should() -> None:
    for text in ("issue 12", "(issue 12, per-slot priors)", "Issue 15 measured", "session 4",
                 "issues 11 and 12", "work period 3", "issue #7"):
        assert DIARY.search(text), text
    for text in ("the decode issue", "an issue of 2 bytes", "sessionStorage", "round 3"):
        assert not DIARY.search(text), text


# -- the examples of docs/wire-format.md and docs/protocol.md ---------------------------------
WIRE_DOC = (ROOT / "docs" / "wire-format.md").read_text(encoding="utf-8")
PROTOCOL_DOC = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")


def _section(doc: str, heading: str) -> str:
    start = doc.index(heading)
    end = doc.find("\n## ", start + 1)
    return doc[start : end if end > 0 else len(doc)]


def test_wire_format_splitmix64_and_tag_examples() -> None:
    from rpsagg import spec

    # section 1: the three published outputs for key 0
    check = re.search(r"first three words are `(0x\w+)`, `(0x\w+)`,\s*`(0x\w+)`", WIRE_DOC)
    assert check is not None
    assert [int(w) for w in spec.stream_words(0, 0, 3)] == [int(g, 16) for g in check.groups()]
    # section 2: every tag row's integer is its ASCII name read big-endian
    rows = re.findall(r"\| `(rps\w{5})`\s*\| `(0x[0-9A-F]{16})`",
                      _section(WIRE_DOC, "## 2. Seeds, tags and stream keys"))
    assert len(rows) == 12
    for name, value in rows:
        assert int.from_bytes(name.encode(), "big") == int(value, 16), name


def test_wire_format_worked_example_of_section_9() -> None:
    from rpsagg import spec

    sec = _section(WIRE_DOC, "## 9. Worked example")
    tags = {"rpsSIGNS": spec.TAG_SIGNS, "rpsROWS_": spec.TAG_ROWS, "rpsRANDK": spec.TAG_RANDK,
            "rpsWNGNI": spec.TAG_WANGNI, "rpsINDCD": spec.TAG_INDUCED}
    table = re.findall(r"\| `(rps\w{5})` \| `(0x\w+)` \| `(0x\w+)` \| `(0x\w+)` \|", sec)
    assert {t for t, *_ in table} == set(tags)
    for tag, key, w0, w1 in table:
        assert spec.stream_key(1, tags[tag]) == int(key, 16)
        assert [int(w) for w in spec.stream_words(int(key, 16), 0, 2)] == [int(w0, 16),
                                                                         int(w1, 16)]
    assert "`rows = [5, 7, 1]`" in sec and spec.srht_rows(1, 3, 8).tolist() == [5, 7, 1]
    assert "the indices are `[3, 0, 2]`" in sec
    assert spec.randk_indices(1, 3, 5).tolist() == [3, 0, 2]
    assert spec.sample_distinct(1, spec.TAG_INDUCED, 2, 5).tolist() == [1, 2]
    u = [float(v) for v in spec.uniforms(1, spec.TAG_WANGNI, 3)]
    assert f"= {u[0]!r}`, then\n`{u[1]!r}`, `{u[2]!r}`" in sec
    bits = re.search(r"bits 0x(\w+), 0x(\w+), 0x(\w+)", sec)
    assert bits is not None
    est = __import__("rpsagg").make_estimator("rand-proj-spatial", n=2, k=3, d=5,
                                               projection="srht")
    y = est.encode(np.array([1.0, 2, 3, 4, 5]), seed=1).values
    assert [int(v) for v in y.view(np.uint32)] == [int(b, 16) for b in bits.groups()]
    seeds = re.findall(r"`seed = (0x\w+)`. With `vector_index = 1`: `(0x\w+)`", sec)
    assert seeds == [(hex(spec.derive_round_seed(1, 2, "client-0", 0)).upper().replace("0X", "0x"),
                      hex(spec.derive_round_seed(1, 2, "client-0", 1)).upper().replace("0X", "0x"))]


def _pseudo_to_python(code: str) -> str:
    """Section 10's pseudo-code as Python: wrapping u64 operators, fn/const, ranges."""
    mask = "0xFFFFFFFFFFFFFFFF"
    out = ["import math", "import numpy as np", f"MASK = {mask}",
           "def bit_length(v): return int(v).bit_length()",
           "def sqrt_f64(v): return math.sqrt(v)",
           "def f32(v): return float(np.float32(v))"]
    for line in code.splitlines():
        line = line.split("#")[0].rstrip().replace("step 2h", "step 2*h")
        if not line.strip():
            continue
        if line.startswith("const "):  # const A = 1, B = 2 -> one statement each
            out.extend(part.strip() for part in line[len("const "):].split(","))
            continue
        line = re.sub(r"^fn (\w+)\((.*)\) -> .*:$", lambda m: "def {}({}):".format(
            m.group(1), re.sub(r": [\w\[\]]+", "", m.group(2))), line)
        line = re.sub(r"(\S.*?) \*wrap (.+)$", r"\1 * \2", line)  # then masked below
        line = line.replace("+wrap", "+").replace("*wrap", "*")
        line = re.sub(r"\(m == 0\) \? 0 : (.+?); t", r"0 if m == 0 else (\1); t", line)
        line = re.sub(r"for (\w+) in (\w+)\.\.(\S+) step (\S+):",
                      r"for \1 in range(\2, \3, \4):", line)
        line = re.sub(r"for (\w+) in (\w+)\.\.(\S+):", r"for \1 in range(\2, \3):", line)
        line = re.sub(r"v = f64\[dp\] filled with 0;  v\[0\.\.d\] = x",
                      "v = [0.0] * dp; v[0:d] = x", line)
        line = line.replace("seen = {}", "seen = set()").replace("j / 64", "j // 64")
        out.append(line)
    src = "\n".join(out)
    # every u64 result is reduced modulo 2^64 where the pseudo-code says "wrap"
    src = src.replace("z = (z ^ (z >> 30)) * MUL1", "z = ((z ^ (z >> 30)) * MUL1) & MASK")
    src = src.replace("z = (z ^ (z >> 27)) * MUL2", "z = ((z ^ (z >> 27)) * MUL2) & MASK")
    src = src.replace("return mix64(key + (t + 1) * GAMMA)",
                      "return mix64((key + (t + 1) * GAMMA) & MASK)")
    src = src.replace("def encode(x, seed, k):", "def encode(x, seed, k):\n    d = len(x)")
    src = src.replace("c = 0 if m == 0 else (word(key, t) >> (64 - m)); t += 1",
                      "c = 0 if m == 0 else (word(key, t) >> (64 - m))\n        t += 1")
    return src


def test_wire_format_section_10_client_runs_and_matches_the_library() -> None:
    # The pseudo-code of "a complete client", translated mechanically (wrapping u64
    # arithmetic made explicit), encodes like the library: the golden SRHT vectors of
    # docs/wire-vectors.json, bit for bit.
    import json

    sec = _section(WIRE_DOC, "## 10. Pseudo-code of a complete client")
    block = re.search(r"```\n(.*?)```", sec, re.S)
    assert block is not None
    namespace: dict[str, object] = {}
    exec(compile(_pseudo_to_python(block.group(1)), "wire-format.md section 10", "exec"),
         namespace)
    encode = namespace["encode"]
    vectors = json.loads((ROOT / "docs" / "wire-vectors.json").read_text(encoding="utf-8"))
    for case in vectors["srht_cases"]:
        x = [float((j % 7) - 3) for j in range(case["d"])]
        y = encode(x, int(case["seed"], 16), case["k"])  # type: ignore[operator]
        bits = [hex(int(v)) for v in np.array(y, dtype=np.float32).view(np.uint32)]
        assert bits == case["y"], case


def test_wire_format_section_12_and_14_worked_examples() -> None:
    import rpsagg
    from rpsagg import spec

    x = np.array([(j % 7) - 3 for j in range(300)], dtype=np.float64)
    sec12 = _section(WIRE_DOC, "## 12. The randomized DCT sketch")
    sec14 = _section(WIRE_DOC, "## 14. Two overlapping Hadamard blocks")
    rows = spec.sample_distinct(1, spec.TAG_ROWS, 9, 300).tolist()
    for sec in (sec12, sec14):
        assert f"`shift = {spec.dct_shift(1, 300)}`" in sec
        assert f"rows = {rows}" in sec
    assert f"stream_key(1, rpsSHIFT) = 0x{spec.stream_key(1, spec.TAG_SHIFT):X}" in sec12
    assert f"stream_key(1, rpsSIGN2) = 0x{spec.stream_key(1, spec.TAG_SIGN2):X}" in sec14
    import json

    vectors = json.loads((ROOT / "docs" / "wire-vectors.json").read_text(encoding="utf-8"))
    (case,) = [c for c in vectors["dct_cases"] if c["d"] == 300 and c["seed"] == "0x1"]
    shown = re.search(r"`y = \[([-\d., ]+), \.\.\.\]`", sec12)
    assert shown is not None  # the binary64 reference, to the 10 digits shown
    assert [float(v) for v in shown.group(1).split(", ")] == pytest.approx(
        [float(v) for v in case["y_f64"][:3]], abs=1e-9)
    hb = rpsagg.make_estimator("rand-proj-spatial", n=2, k=9, d=300, projection="hblocks")
    shown = re.search(r"`y = \[([-\d., ]+)\]`", sec14)
    assert shown is not None
    assert [float(v) for v in shown.group(1).split(", ")] == hb.encode(x, 1).values.tolist()


def test_wire_format_section_13_examples() -> None:
    import json

    from rpsagg.quantize import centroids, pack_codes

    sec = _section(WIRE_DOC, "## 13. Quantized values")
    assert "codes 1, 2, 3 at b = 2 pack to the single byte `0x39`" in sec
    assert pack_codes(np.array([1, 2, 3]), 2) == bytes([0x39])
    for b in (1, 2):
        table = "[" + ", ".join(float(c).hex() for c in centroids(b)) + "]"
        assert f"b = {b} is\n`{table}`" in sec or f"b = {b} is `{table}`" in sec.replace(
            "\n", " ")
    vectors = json.loads((ROOT / "docs" / "wire-vectors.json").read_text(encoding="utf-8"))
    by_label: dict[tuple[str, str], tuple[str, str, int]] = {}
    for c in vectors["quantized_cases"]:
        if "d" not in c:  # the d = 20 golden-x cases the table shows
            key = (c["message_scheme"], json.dumps(c["options"], sort_keys=True))
            by_label[key] = (c["packed_hex"], c["scale_bits"].lower(), c["bits"])
    row = r"^\| `([\w:-]+)`(?: \(SRHT\))?, ([^|]+) \| `(\w+)` \| `(0x\w+)` \| (\d+) \|$"
    rows = re.findall(row, sec, re.M)
    assert len(rows) == 7
    for scheme, opts, packed, scale, size in rows:
        found = [v for (s, o), v in by_label.items() if s == scheme and all(
            f'"{n.strip("` ")}": {val.strip()}' in o for n, val in
            (part.split("=") for part in opts.split(",")))]
        assert found == [(packed, scale.lower(), int(size))], (scheme, opts)


def test_protocol_spec_version_refusals_are_the_servers_messages() -> None:
    # The two example messages of the status-code table are what the server says.
    import rpsagg
    from rpsagg.schemes import WireProfile
    from rpsagg_server.domain.errors import DomainError
    from rpsagg_server.rounds.requestchecks import check_submission_spec
    from rpsagg_wire.v1.serde import Submission

    def refusal(sent: str, wire: WireProfile) -> str:
        sub = Submission(round_id=1, client_id="c0", client_seed=1, vectors=(),
                         spec_version=sent)
        with pytest.raises(DomainError) as info:
            check_submission_spec(sub, wire)
        return info.value.message

    hb = rpsagg.make_estimator("rand-proj-spatial", n=2, k=8, d=300)
    quant = rpsagg.make_estimator("rand-proj-spatial", n=2, k=8, d=128, value_bits=4)
    for msg in (refusal("", hb.wire), refusal("rpsagg-seed-v2", quant.wire)):
        assert f"`{msg}`" in PROTOCOL_DOC, msg
