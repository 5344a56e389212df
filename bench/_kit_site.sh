# Sourced by gpu_kit.sh and gpu_trainer_ab.sh from the repository root, with PY set: installs the
# wheels carried in .whl/ (bench/gpu_kit_wheels.sh writes them) into a scratch site and puts it,
# and this checkout, on PYTHONPATH. Without .whl/ it stops at once, unless KIT_NO_WHEELS=1 (a
# machine with everything).
WHEELS="${KIT_WHEELS:-.whl}"
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    SITE="${KIT_SITE:-/tmp/llava-norm-kit-site}"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
elif [ "${KIT_NO_WHEELS:-0}" != 1 ]; then
    echo "$(basename "$0"): no wheels in $WHEELS/: run 'bash bench/gpu_kit_wheels.sh' here and carry .whl (or KIT_NO_WHEELS=1)" >&2
    exit 2
fi
export PYTHONUNBUFFERED=1
