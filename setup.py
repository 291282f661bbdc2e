"""The optional C extension modules (the project's metadata is in pyproject.toml).

`pip install .` / `pip install -e .` / `make demo` compile them where a C compiler
and the Python headers are found. Without them the build warns and goes on: the
package installs without the extensions and runs its pure-Python core (the same
outputs, slower). `kwinspect --version` says which core runs. Listed modules must
match kwinspect/core.py's EXTENSIONS (tests/test_core.py).
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

EXTENSIONS = [
    Extension("kwinspect.capture._cpackets", ["kwinspect/capture/_cpackets.c"],
              depends=["kwinspect/capture/_cparse.h"], extra_compile_args=["-O2", "-std=c99"]),
    Extension("kwinspect.protocol._cdecode", ["kwinspect/protocol/_cdecode.c"], depends=["kwinspect/protocol/_crc32c.h"],
              extra_compile_args=["-O2", "-std=c99"]),
    Extension("kwinspect.stream._clabels", ["kwinspect/stream/_clabels.c"],
              extra_compile_args=["-O2", "-std=c99"]),
    Extension("kwinspect.stream._cconv", ["kwinspect/stream/_cconv.c"], depends=["kwinspect/_cattrs.h"],
              extra_compile_args=["-O2", "-std=c99"]),
    Extension("kwinspect.export._crender", ["kwinspect/export/_crender.c"], depends=["kwinspect/_cattrs.h"],
              extra_compile_args=["-O2", "-std=c99"]),
    # (the driver's packet loop shares the link/IP/TCP parse of capture/_cpackets.c)
    Extension("kwinspect._cdriver", ["kwinspect/_cdriver.c"],
              depends=["kwinspect/capture/_cparse.h", "kwinspect/_cattrs.h"],
              extra_compile_args=["-O2", "-std=c99"]),
    Extension("kwinspect.analyze._crows", ["kwinspect/analyze/_crows.c"], depends=["kwinspect/_cattrs.h"],
              extra_compile_args=["-O2", "-std=c99"]),
    # the --jobs reader's routing loop (run/split.py)
    Extension("kwinspect.run._csplit", ["kwinspect/run/_csplit.c"], extra_compile_args=["-O2", "-std=c99"]),
    # tshark's tcp.stream numbers in compact entries (capture/tcp.py's TcpStreamNumbers)
    Extension("kwinspect.capture._cstreams", ["kwinspect/capture/_cstreams.c"], extra_compile_args=["-O2", "-std=c99"]),
]


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install: a module that does not compile is left out."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - no compiler at all, broken toolchain, ...
            self._skip("the C extensions", exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - compile or link error, missing headers
            self._skip(ext.name, exc)

    @staticmethod
    def _skip(what: str, exc: Exception) -> None:
        import sys

        print(f"WARNING: kwinspect: {what} could not be built ({type(exc).__name__}: {exc}); "
              "installing the pure-Python core (same results, slower)", file=sys.stderr)


setup(ext_modules=EXTENSIONS, cmdclass={"build_ext": OptionalBuildExt})
