"""Optional compiled kernels (``rpsagg/_fast.c``): of the encode (sign multiply, row sampling,
last butterfly stage; bit-identical to the numpy code, which is used where no C compiler is)
and of the decode's joint SRHT products by tiles (the numpy passes where no C compiler is).

Everything else about the package is in ``pyproject.toml``; extension modules are declared
here because setuptools' ``[tool.setuptools.ext-modules]`` table is still experimental (and
warns at every build).
"""

from setuptools import Extension, setup

if __name__ == "__main__":  # how setuptools runs it; an editable install puts common/ on sys.path
    setup(ext_modules=[
        # -pthread: the hblocks encode's helper thread (glibc before 2.34 keeps pthreads apart)
        Extension("rpsagg._fast", sources=["rpsagg/_fast.c"],
                  extra_compile_args=["-O3", "-pthread"], extra_link_args=["-pthread"],
                  optional=True),
    ])
