"""The README's quick start, run as written by a new user: a fresh shell (no
venv active, no PYSPARK_PYTHON, no PYTHONPATH), a temporary home directory, the
commands of the README's quickstart block exactly: set-up, `cluster start`,
`topics`, console producer and consumer, a Python producer, a plain PySpark
script with no extra call, `cluster stop`."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from replikafka.local_cluster import load_state, running_pids

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


def quickstart_script() -> str:
    readme = (REPO / "README.md").read_text()
    m = re.search(r"<!-- quickstart[^>]*-->\s*```bash\n(.*?)```\s*<!-- /quickstart -->", readme, re.S)
    assert m, "README has no quickstart block"
    return m.group(1)


def fresh_shell_env(home: Path) -> dict[str, str]:
    venv_bin = str(REPO / ".venv" / "bin")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH", "VIRTUAL_ENV", "BS")}
    env.update(HOME=str(home), PATH=os.pathsep.join(path))
    return env


@pytest.mark.spark
@pytest.mark.long  # 1-3 min: a cluster and a Spark session
def test_the_readme_quickstart_works_as_written(tmp_path):
    script = quickstart_script()
    cluster_dir = tmp_path / "rk-try" / "cluster"
    try:
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=REPO, env=fresh_shell_env(tmp_path),
                           capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-4000:]
        assert "bootstrap servers: 127.0.0.1:" in r.stdout
        assert "hello" in r.stdout                        # console consumer
        assert "RecordMetadata(" in r.stdout              # Python producer, key+value only
        assert "records: 3" in r.stdout, out[-4000:]     # the PySpark script
        assert "cluster stopped" in r.stdout
        assert "DATA_SOURCE_NOT_FOUND" not in out
    finally:
        if (cluster_dir / "cluster.json").exists():  # a failed run must not leave processes behind
            for pid in running_pids(load_state(str(cluster_dir))).values():
                os.kill(pid, 9)


def test_a_fresh_interpreter_of_the_venv_finds_the_data_source_and_runs_workers_there(tmp_path):
    """What Spark's discovery does (pkgutil.iter_modules in a worker), in a fresh
    interpreter with no PYTHONPATH and no PYSPARK_PYTHON: fast, no Spark."""
    probe = ("import os, pkgutil, sys; "
             "print([m.name for m in pkgutil.iter_modules() if m.name == 'pyspark_replikafka']); "
             "print(os.environ.get('PYSPARK_PYTHON') == sys.executable)")
    r = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", probe], cwd=tmp_path,
                       env=fresh_shell_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["['pyspark_replikafka']", "True"], r.stdout


def test_the_wheel_holds_every_package_and_the_data_source_at_top_level(tmp_path):
    import zipfile

    r = subprocess.run([str(REPO / "build.sh"), "dist"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    wheel = Path(REPO / r.stdout.strip().splitlines()[-1])
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "pyspark_replikafka/__init__.py" in names
    for init in list(REPO.glob("python/replikafka/**/__init__.py")) + list(REPO.glob("broker/**/__init__.py")):
        rel = init.relative_to(REPO)
        inside = ("replikafka/" + str(rel)[len("python/replikafka/"):] if str(rel).startswith("python/")
                  else "replikafka/" + str(rel))
        assert inside in names, f"{rel} is not in the wheel (add its package to pyproject.toml)"
    assert "replikafka/protocol/replikafka_pb2.py" in names
