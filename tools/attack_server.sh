#!/usr/bin/env bash
# Hostile clients against `ultra serve` (docs/RELIABILITY.md): slowloris and slow-body attacks
# (slowhttptest, 1000 connections each) while wrk measures /health and completions; 1000 idle connections;
# a 100 MB header flood and a gzip bomb, with the server's RSS before and after. Prints a summary.
#   tools/attack_server.sh [ULTRA_BIN] [SECONDS]     (default build/ultra, 45 s per attack)
# Needs slowhttptest, wrk and python3 (Debian: slowhttptest wrk).
set -euo pipefail
bin=${1:-build/ultra}
secs=${2:-45}
port=${PORT:-18090}
out=${OUT:-/tmp/ultra-attack}
mkdir -p "$out"
ulimit -n "$(ulimit -Hn)"
"$bin" serve --port "$port" --parallel 4 -c 512 >"$out/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
rss() { awk '/VmRSS/ {print $2}' "/proc/$pid/status"; }
cat >"$out/complete.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"prompt": "ROMEO:", "max_tokens": 8, "temperature": 0}'
LUA
lat() {  # wrk's p50 / p99 and requests/s, one line
  wrk "$@" --latency 2>&1 | awk '/^ +50%/ {p50=$2} /^ +99%/ {p99=$2} /Requests\/sec/ {rps=$2}
    /Non-2xx/ {bad=$NF} /Socket errors/ {err=$0} END {printf "p50 %s p99 %s req/s %s non-2xx %s %s\n", p50, p99, rps, bad+0, err}'
}
echo "RSS at start: $(rss) kB"
echo "baseline        /health:      $(lat -t1 -c4 -d10s "http://127.0.0.1:$port/health")"
echo "baseline        completions:  $(lat -t1 -c4 -d10s -s "$out/complete.lua" "http://127.0.0.1:$port/v1/completions")"

attack() {  # name, slowhttptest args
  local name=$1
  shift
  slowhttptest "$@" -c 1000 -r 200 -i 2 -l "$secs" -p 3 -g -o "$out/$name" >"$out/$name.txt" 2>&1 &
  local sp=$!
  sleep 5
  echo "$name /health:      $(lat -t1 -c4 -d$((secs - 10))s "http://127.0.0.1:$port/health")"
  echo "$name completions:  $(lat -t1 -c4 -d5s -s "$out/complete.lua" "http://127.0.0.1:$port/v1/completions")"
  wait $sp || true
  grep -E "^(Exit status|Test ended|service available)" "$out/$name.txt" | tr -s ' \t' ' ' | sed "s/^/  $name: /" || true
  tail -3 "$out/$name.csv" | head -1 | sed "s/^/  $name last sample (seconds,closed,pending,connected,available): /"
}
attack slowloris -H -x 24 -u "http://127.0.0.1:$port/health"
attack slowbody -B -s 8192 -x 10 -t POST -f application/json -u "http://127.0.0.1:$port/v1/completions"
echo "RSS after the slow attacks: $(rss) kB"

python3 - "$port" "$pid" <<'PY'
import gzip, socket, sys, time
port, pid = int(sys.argv[1]), sys.argv[2]
def rss():
    return next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS"))
def request(raw, timeout=30):
    s = socket.create_connection(("127.0.0.1", port)); s.settimeout(timeout)
    try:
        s.sendall(raw)
    except OSError:
        pass
    out = b""
    try:
        while b"\r\n\r\n" not in out:
            d = s.recv(65536)
            if not d: break
            out += d
    except OSError:
        pass
    s.close()
    return out.split(b"\r\n", 1)[0].decode(errors="replace")
def complete_ms():
    t = time.time()
    body = b'{"prompt": "ROMEO:", "max_tokens": 8}'
    line = request(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    return (time.time() - t) * 1000, line
print("one completion, no load: %.1f ms (%s)" % complete_ms())
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(1000)]
time.sleep(0.5)
print("one completion beside 1000 idle connections: %.1f ms (%s)" % complete_ms())
for s in idle: s.close()
before = rss()
flood = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + b"X-Flood: abcdefgh\r\n" * (100 * 1024 * 1024 // 19)
t = time.time(); line = request(flood)
print("100 MB header flood: %s in %.1f ms; RSS %d -> %d kB" % (line, (time.time() - t) * 1000, before, rss()))
bomb = gzip.compress(b"\0" * (512 * 1024 * 1024), 9)
before = rss(); t = time.time()
line = request(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb) + bomb)
print("gzip bomb (%d bytes -> 512 MiB): %s in %.1f ms; RSS %d -> %d kB" % (len(bomb), line, (time.time() - t) * 1000, before, rss()))
PY
echo "RSS at the end: $(rss) kB"
kill -0 $pid && echo "server alive: $(curl -s "http://127.0.0.1:$port/health")"
