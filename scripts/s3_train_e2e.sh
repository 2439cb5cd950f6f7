#!/usr/bin/env bash
# `looprl train -c configs/smoke.toml` (tiny model, the example tasks, SFT 10 steps, RL 3 steps) with its
# weight store on moto's S3 server on loopback (fleet.experimental.weights_url/weights_options),
# then lists what the store holds. Needs the test extra (moto[server], s3fs).
# Usage: bash scripts/s3_train_e2e.sh   (PY=path/to/python to use another venv)
set -u
SERVE="from moto.moto_server.threaded_moto_server import ThreadedMotoServer as S
import threading
s = S('127.0.0.1', 0, verbose=False); s.start()
print(s.get_host_and_port()[1], flush=True); threading.Event().wait()"
cd "$(dirname "$0")/.."; W=$(mktemp -d)
PY=${PY:-.venv/bin/python}
$PY -c "$SERVE" > $W/port 2>/dev/null &
SERVER=$!
for i in $(seq 50); do [ -s $W/port ] && break; sleep 0.2; done
PORT=$(cat $W/port); echo "moto S3 on 127.0.0.1:$PORT (pid $SERVER)"
# configs/smoke.toml (the smallest end-to-end run) with its weight store on the S3 server
{ cat configs/smoke.toml; cat <<TOML
[fleet.experimental]
weights_url = "s3://looprl-e2e/run"
weights_options = {endpoint_url = "http://127.0.0.1:$PORT", key = "test", secret = "test"}
TOML
} > $W/s3.toml
rm -rf $W/runs
OMP_NUM_THREADS=1 PYTHONPATH=$PWD/src timeout 900 $PY -m looprl.cli train -c $W/s3.toml --runs $W/runs -o name=s3e2e
echo "train rc=$?"
PORT=$PORT $PY - <<'PYEOF'
import json, os, s3fs
fs = s3fs.S3FileSystem(endpoint_url=f"http://127.0.0.1:{os.environ['PORT']}", key="test", secret="test")
objs = fs.find("looprl-e2e/run", detail=True)
print(f"{len(objs)} objects under s3://looprl-e2e/run, {sum(o['size'] for o in objs.values())} bytes")
for k, o in sorted(objs.items())[:30]:
    extra = ""
    if k.endswith("manifest.json"):
        m = json.loads(fs.cat(k))
        extra = f" kind={m['kind']} parent={m['parent']}"
    print(f"  {k} {o['size']}{extra}")
PYEOF
kill $SERVER; rm -rf "$W"
