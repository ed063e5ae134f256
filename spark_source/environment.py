"""Getting Spark's Python workers to run replikafka.

Two things must hold before the JVM starts (that is, before the first
``SparkSession`` is built in this process), or the first ``format("replikafka")``
fails inside a worker:

1. The workers run an interpreter in which replikafka (and pyarrow, grpc) is
   installed. Spark starts workers with ``$PYSPARK_PYTHON``, defaulting to
   whatever ``python3`` is on the PATH — often a system Python without
   pyarrow. :func:`prepare_spark_environment` sets it to this process's
   interpreter when it is unset (``./build.sh`` exports it too).
2. pyspark finds ``pyspark_replikafka`` with ``pkgutil.iter_modules()``. A
   regular install puts it in site-packages, where that works. An editable
   install (``pip install -e .``, as ``./build.sh`` does) maps packages through
   an import hook that ``iter_modules`` cannot list, so the data source would
   be importable but never registered. In that case this module puts a small
   directory holding only a link to the package on the workers'
   ``PYTHONPATH``.

:func:`local_session` does both and builds a local session; anything else
(``spark-submit``, a cluster) should set ``PYSPARK_PYTHON`` /
``spark.pyspark.python`` to an interpreter with replikafka installed.

So that a plain script needs neither call, ``./build.sh setup`` runs
(:func:`install_for_this_interpreter`):
a ``.pth`` file in the venv's site-packages puts a directory holding only the
link to ``pyspark_replikafka`` on every interpreter's path (the driver's and the
workers'), and makes ``PYSPARK_PYTHON`` default to the venv's interpreter.
A wheel (``./build.sh dist``) needs none of this: ``pyspark_replikafka`` is
then an ordinary top-level package.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

PACKAGE = "pyspark_replikafka"


def _package_dir() -> Path | None:
    here = Path(__file__).resolve().parent / PACKAGE
    return here if (here / "__init__.py").exists() else None


#: Written into the shim directory as ``sitecustomize.py`` (see point 3 above).
_SITECUSTOMIZE = '''"""replikafka: import the installed pyspark rather than the same pyspark from
its own python/lib/pyspark.zip (compiled afresh by every worker otherwise)."""
import os as _os
import sys as _sys


def _prefer_installed_pyspark():
    for i, entry in enumerate(list(_sys.path)):
        if not entry.endswith(_os.sep + "pyspark.zip"):
            continue
        lib = _os.path.dirname(entry)                                  # .../site-packages/pyspark/python/lib
        site = _os.path.dirname(_os.path.dirname(_os.path.dirname(lib)))
        if _os.path.basename(_os.path.dirname(_os.path.dirname(lib))) != "pyspark" or site not in _sys.path:
            return
        _sys.path.remove(entry)
        _sys.path.insert(_sys.path.index(site) + 1, entry)
        return


_prefer_installed_pyspark()
'''


def shim_dir() -> Path | None:
    """A directory put first on the workers' ``PYTHONPATH`` (created on first
    use): a link to the ``pyspark_replikafka`` package when it is not
    discoverable otherwise, and the ``sitecustomize`` of point 3."""
    pkg = _package_dir()
    base = Path(tempfile.gettempdir()) / f"replikafka-spark-path-{os.getuid()}"
    link = base / PACKAGE
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        if pkg is not None:
            if link.is_symlink() and Path(os.readlink(link)) != pkg:
                link.unlink()
            if not link.exists():
                link.symlink_to(pkg, target_is_directory=True)
        custom = base / "sitecustomize.py"
        if not custom.exists() or custom.read_text() != _SITECUSTOMIZE:
            tmp = base / f".sitecustomize.{os.getpid()}"
            tmp.write_text(_SITECUSTOMIZE)
            tmp.replace(custom)
    except OSError:
        return None
    return base


def prepare_spark_environment(env: dict | None = None) -> dict[str, str]:
    """Set ``PYSPARK_PYTHON`` (if unset) and put the shim directory first on the
    workers' ``PYTHONPATH``; returns what it changed. Call it before the first
    SparkSession of the process is created."""
    env = os.environ if env is None else env
    changed: dict[str, str] = {}
    if not env.get("PYSPARK_PYTHON"):
        env["PYSPARK_PYTHON"] = changed["PYSPARK_PYTHON"] = sys.executable
    shim = shim_dir()
    if shim is not None:
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(shim) not in parts:
            env["PYTHONPATH"] = changed["PYTHONPATH"] = os.pathsep.join([str(shim)] + parts)
    return changed


def local_session(app_name: str = "replikafka", master: str = "local[2]", conf: dict | None = None):
    """A local ``SparkSession`` whose workers can run replikafka."""
    prepare_spark_environment()
    from pyspark.sql import SparkSession
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
    }
    settings.update(conf or {})
    for k, v in settings.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


DISCOVERY_PTH = "replikafka-spark-discovery.pth"


def install_discovery(site_dir: Path, prefix: Path) -> Path:
    """Write ``site_dir/replikafka-spark-discovery.pth`` for an editable install:
    its first line adds ``prefix/replikafka-spark-path`` (a directory holding
    only a link to ``pyspark_replikafka``) to ``sys.path``, so
    ``pkgutil.iter_modules`` finds the data source in every interpreter of the
    environment; its second sets ``PYSPARK_PYTHON`` to that interpreter when
    unset, so Spark's workers run where replikafka is installed. Returns the
    .pth path."""
    pkg = _package_dir()
    if pkg is None:
        raise FileNotFoundError(f"{PACKAGE} is not in a source tree next to {__file__}")
    base = prefix / "replikafka-spark-path"
    base.mkdir(parents=True, exist_ok=True)
    link = base / PACKAGE
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(pkg, target_is_directory=True)
    pth = site_dir / DISCOVERY_PTH
    pth.write_text(f"{base}\n"
                   "import os, sys; os.environ.setdefault('PYSPARK_PYTHON', sys.executable)\n")
    return pth


def install_for_this_interpreter() -> Path:
    """:func:`install_discovery` into this interpreter's environment (``./build.sh setup``)."""
    import sysconfig

    return install_discovery(Path(sysconfig.get_paths()["purelib"]), Path(sys.prefix))
