#!/usr/bin/env bash
# The communication cost of tensor parallelism between two "hosts" of this machine: two network namespaces
# joined by a veth pair (iproute2), tc netem delaying each direction by DELAY (default 50us), Open MPI's TCP
# transport forced onto the veth. Also over TCP on loopback and over Open MPI's shared memory, for reference.
# Runs build/bench_comm (bench/bench_comm.cpp) and prints its JSON lines, one per (path, size).
#   sudo bench/comm_netns.sh [DELAY] [BUILD_DIR] [-- bench_comm options...]
# Needs root (ip netns, tc). mpirun starts in namespace A; the rank of namespace B is started through an rsh
# agent that runs Open MPI's daemon there (`ip netns exec B`, in its own UTS namespace with another host name
# so that Open MPI counts it as a second node and does not use shared memory between the two).
# --bind-to none: each "host"'s daemon would bind its rank to core 0, putting both on one core of this
# machine. The namespaces and the veth pair are removed on exit.
set -euo pipefail
delay=${1:-50us}
build=${2:-build}
shift $(($# >= 2 ? 2 : $#))
[ "${1:-}" = "--" ] && shift
extra=("$@")
bench=$(realpath "$build/bench_comm")
[ -x "$bench" ] || {
  echo "no $bench: build the bench_comm target" >&2
  exit 1
}

ns_a=ultra-tp-a ns_b=ultra-tp-b
ip_a=10.213.0.1 ip_b=10.213.0.2
ns_del() {
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
}
ns_del  # a run that was killed
work=$(mktemp -d)
trap 'ns_del; rm -rf "$work"' EXIT

ip netns add "$ns_a"
ip netns add "$ns_b"
ip link add utp-a type veth peer name utp-b
ip link set utp-a netns "$ns_a"
ip link set utp-b netns "$ns_b"
ip -n "$ns_a" addr add "$ip_a/24" dev utp-a
ip -n "$ns_b" addr add "$ip_b/24" dev utp-b
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns_a" link set utp-a up
ip -n "$ns_b" link set utp-b up
# A kernel without sch_netem (tc: "Specified qdisc kind is unknown", e.g. a Firecracker guest's) runs the veth
# without the delay, and says so in the "path" of its lines.
path="veth+netem $delay"
if [ "$delay" = 0 ]; then
  path="veth"
elif ! ip netns exec "$ns_a" tc qdisc add dev utp-a root netem delay "$delay" ||
  ! ip netns exec "$ns_b" tc qdisc add dev utp-b root netem delay "$delay"; then
  echo "comm_netns.sh: no tc netem in this kernel: the veth runs without the $delay delay" >&2
  ip netns exec "$ns_a" tc qdisc del dev utp-a root 2>/dev/null || true
  path="veth (no netem in this kernel)"
fi
command -v ping >/dev/null && ip netns exec "$ns_a" ping -c 3 -q "$ip_b" | tail -1 >&2

# The rsh agent: `agent [ssh options] HOST COMMAND...`: HOST is an address; run COMMAND in its namespace.
cat >"$work/agent" <<EOF
#!/usr/bin/env bash
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done  # ssh-style options
host=\$1; shift
case \$host in
  $ip_a) ns=$ns_a ;;
  $ip_b) ns=$ns_b ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c "hostname \$ns; exec \$*"
EOF
chmod +x "$work/agent"
printf '%s slots=1\n%s slots=1\n' "$ip_a" "$ip_b" >"$work/hosts"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== $path between two namespaces (TCP)" >&2
ip netns exec "$ns_a" unshare --uts /bin/sh -c "hostname $ns_a; exec mpirun -np 2 --bind-to none --hostfile $work/hosts \
  --mca plm_rsh_agent $work/agent --mca btl tcp,self --mca btl_tcp_if_include 10.213.0.0/24 \
  --mca oob_tcp_if_include 10.213.0.0/24 -x PATH -x LD_LIBRARY_PATH $bench --json ${extra[*]}" |
  sed 's/^{/{"path": "'"$path"'", /'

echo "== loopback (TCP on lo)" >&2
mpirun -np 2 --bind-to none --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include lo "$bench" --json "${extra[@]}" |
  sed 's/^{/{"path": "loopback tcp", /'

echo "== shared memory (Open MPI vader)" >&2
mpirun -np 2 --bind-to none --oversubscribe --mca btl vader,self "$bench" --json "${extra[@]}" |
  sed 's/^{/{"path": "shared memory", /'
