"""Optional compiled kernels (``rpsagg/_fast.c``, which includes one file per concern from
``rpsagg/fastc/``: one translation unit, one extension module): of the encode (sign
multiply, row sampling, last butterfly stage; bit-identical to the numpy code, which is
used where no C compiler is) and of the decode's joint SRHT products by tiles (the numpy
passes where no C compiler is).

``RPSAGG_NATIVE_REQUIRED=1`` in the environment of the build makes the extension required: the
build then fails with the compiler's error instead of installing the library without it (the
Docker images build so).

``-ffp-contract=off`` keeps GCC from fusing a multiply and an add into one FMA instruction (one
rounding instead of two) where the target has FMA (``CFLAGS=-march=native``, say): the
kernels' bits do not depend on the flags of the build (the server's image and a user's
library give the same estimate).

Everything else about the package is in ``pyproject.toml``; extension modules are declared
here because setuptools' ``[tool.setuptools.ext-modules]`` table is still experimental (and
warns at every build).
"""

import os
from pathlib import Path

from setuptools import Extension, setup

# the files _fast.c includes: a change to one of them rebuilds the module (and they go into
# the sdist with it)
PARTS = sorted(str(p.relative_to(Path(__file__).parent))
               for p in (Path(__file__).parent / "rpsagg" / "fastc").glob("*.c"))

if __name__ == "__main__":  # how setuptools runs it; an editable install puts common/ on sys.path
    setup(ext_modules=[
        # -pthread: the hblocks encode's helper thread (glibc before 2.34 keeps pthreads apart);
        # -ffp-contract=off: no FMA contraction (after the CFLAGS, so it holds whatever they say)
        Extension("rpsagg._fast", sources=["rpsagg/_fast.c"], depends=PARTS,
                  extra_compile_args=["-O3", "-ffp-contract=off", "-pthread"],
                  extra_link_args=["-pthread"],
                  optional=os.environ.get("RPSAGG_NATIVE_REQUIRED", "") != "1"),
    ])
