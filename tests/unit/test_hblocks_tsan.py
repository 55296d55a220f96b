"""hblocks' two-thread encode under ThreadSanitizer (the C harness ``tsan_hb_pipe.c``).

The helper thread, the job claims and the barrier between the phases are C atomics and
pthreads; the Python tests check results, this one checks the memory accesses: gcc's
ThreadSanitizer reports any data race between the callers, the helper and a helper that
wakes late. Skipped where gcc cannot build with ``-fsanitize=thread`` against this Python.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from repo_paths import TESTS

pytestmark = pytest.mark.unit

HERE = TESTS
FAST_C = HERE.parent / "common" / "rpsagg" / "_fast.c"


def test_two_thread_encode_has_no_data_race(tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    libdir, version = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("VERSION")
    if gcc is None or not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        pytest.skip("needs gcc and a shared libpython")
    # whether this gcc builds and runs ThreadSanitizer programs at all (a skip); after this
    # any failure to build or run the harness is a failure of the test
    (tmp_path / "probe.c").write_text("int main(void) { return 0; }\n")
    probe = subprocess.run([gcc, "-fsanitize=thread", str(tmp_path / "probe.c"), "-o",
                            str(tmp_path / "probe")], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0 or subprocess.run([str(tmp_path / "probe")]).returncode != 0:
        pytest.skip(f"gcc cannot build with ThreadSanitizer here: {probe.stderr[-300:]}")
    # _fast.c and the files it includes (fastc/*.c), copied with the target_clones switch
    # turned off (ThreadSanitizer and ifunc resolvers do not mix)
    clones = "__has_attribute(target_clones) && !defined(__clang__)"
    (tmp_path / "_fast_noclones.c").write_text(FAST_C.read_text())
    (tmp_path / "fastc").mkdir()
    switched = 0
    for part in sorted((FAST_C.parent / "fastc").glob("*.c")):
        text = part.read_text()
        switched += text.count(clones)
        (tmp_path / "fastc" / part.name).write_text(text.replace(clones, "0"))
    assert switched == 1  # the switch this harness turns off
    shutil.copy(HERE / "tsan_hb_pipe.c", tmp_path)
    exe = tmp_path / "tsan_hb_pipe"
    build = subprocess.run(
        [gcc, "-O1", "-g", "-mavx2", "-fsanitize=thread", "-I", sysconfig.get_paths()["include"],
         str(tmp_path / "tsan_hb_pipe.c"), "-L", str(libdir), f"-lpython{version}", "-lm",
         "-lpthread", "-o", str(exe)],
        capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300,
                         env={"LD_LIBRARY_PATH": str(libdir), "TSAN_OPTIONS": "halt_on_error=1"})
    assert "WARNING: ThreadSanitizer" not in run.stderr, run.stderr[-4000:]
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.stdout, run.stderr[-2000:])
