#!/usr/bin/env bash
# replikafka build entry point.
#   ./build.sh test [pytest args]   set up .venv, generate stubs, run the default test suite
#   ./build.sh test --long          also the long fault-injection and fuzz runs
#   ./build.sh demo                 ZooKeeper + 3 brokers, produce, read with Spark, kill a broker
#   ./build.sh bench [storage|cluster|replication|spark|scale ...]   benchmarks, printed as a table
#   ./build.sh setup                only set up .venv and generate stubs
#   ./build.sh dist                 build dist/replikafka-<version>-py3-none-any.whl
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

setup() {
    if [ ! -x "$PY" ]; then
        echo "build.sh: creating $VENV" >&2
        python3 -m venv "$VENV"
    fi
    local stamp="$VENV/.replikafka-installed"
    if [ ! -f "$stamp" ] || [ requirements.lock -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        echo "build.sh: installing pinned dependencies" >&2
        "$PY" -m pip install -q -r requirements.lock
        "$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null \
            || "$PY" -m pip install -q --no-deps -e .
        touch "$stamp"
    fi
    gen_stubs
    ensure_chromium
    # Spark finds pyspark_replikafka in any interpreter of this venv (editable installs hide it)
    local pth
    pth=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/replikafka-spark-discovery.pth
    if [ ! -f "$pth" ]; then
        "$PY" -c 'from replikafka.spark.environment import install_for_this_interpreter as i; i()'
    fi
}

# The status page's browser test drives Debian's chromium headless (tests/integration/test_monitoring.py).
ensure_chromium() {
    if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
        return 0
    fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "build.sh: installing chromium (Debian package) for the status page test" >&2
        apt-get install -y -q chromium >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
            || echo "build.sh: could not install chromium; the status page test will fail" >&2
    else
        echo "build.sh: chromium is not installed (apt-get install chromium); the status page test needs it" >&2
    fi
}

dist() {
    # A wheel for other machines (Spark executors: pip install dist/replikafka-*.whl)
    rm -rf build dist/replikafka-*.whl
    "$PY" -m pip wheel -q --no-deps --no-build-isolation -w dist .
    ls dist/replikafka-*.whl
}

gen_stubs() {
    local proto=python/replikafka/protocol/replikafka.proto
    local out=python/replikafka/protocol/replikafka_pb2.py
    if [ ! -f "$out" ] || [ "$proto" -nt "$out" ]; then
        "$PY" -m grpc_tools.protoc -Ipython --python_out=python --grpc_python_out=python "$proto"
    fi
}

export PYSPARK_PYTHON="$PY"
export PYSPARK_DRIVER_PYTHON="$PY"

cmd=${1:-test}
shift || true
case "$cmd" in
    setup) setup ;;
    test) setup; exec "$PY" -m pytest "$@" ;;
    demo) setup; exec "$PY" -m replikafka.demo "$@" ;;
    bench) setup; exec "$PY" -m bench "$@" ;;
    dist) setup; dist ;;
    *) echo "usage: ./build.sh test|demo|bench|setup|dist" >&2; exit 2 ;;
esac
