#!/bin/bash
# Second-turn time to first token through a session vs re-prefilling the whole transcript, on
# the bench model at a tight budget (5.5 GiB = 5.0 model plan + 0.5 sessions), cgroup-limited
# to the budget, page cache dropped before every measured request. Also save/restore.
# Run as root (cgroup v1 memory group, drop_caches) under the machine-wide bench lock:
#   RELEASE=target/release WORK=/tmp/k3-sessions-bench flock /work/scratch/bench.lock tests/sessions/bench.sh
# Results (client summaries, save/restore, file size, cgroup peak) go to $WORK/bench.out.
set -eu
W=${WORK:-/work/scratch/s2-sessions}
R=${RELEASE:-$W/target/release}
SOCK=$W/bench.sock
SDIR=$W/bench-sessions
LOG=$W/bench-daemon.log
OUT=$W/bench.out
mkdir -p $W; rm -rf $SDIR; : > $OUT
CG=/sys/fs/cgroup/memory$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)/s2-sessions-bench
mkdir -p $CG && echo $((11 * (1<<29))) > $CG/memory.limit_in_bytes
start_daemon() {
  sh -c "echo \$\$ > $CG/cgroup.procs; exec $R/k3d serve --model ${MODEL:-/work/scratch/bench/model} --socket $SOCK --threads 2 --max-active 1 --ram-gb 5.5 --session-gb 0.5 --session-dir $SDIR" >>$LOG 2>&1 &
  DPID=$!
  until $R/k3 --socket $SOCK status 2>/dev/null | grep -q "daemon .*ready"; do sleep 0.5; done
}
ids() { python3 -c "import sys; print(' '.join(str((i*37+11)%893) for i in range(int(sys.argv[1]))))" $1; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# k3 run; prints the client's summary line (stderr) into $OUT with a label; stdout = ids.
run() { local label=$1; shift; local t0=$(date +%s.%N)
  $R/k3 --socket $SOCK run --ids "$@" 2>$W/run.err
  local t1=$(date +%s.%N)
  echo "$label wall=$(echo "$t1 - $t0" | bc) $(grep '^k3:' $W/run.err)" >> $OUT; }
: > $LOG
t0=$(date +%s.%N); start_daemon; echo "daemon ready in $(echo "$(date +%s.%N) - $t0" | bc) s" >> $OUT
P1=$(ids 320)
G1=$(run turn1 --max-tokens 2 --session conv "$P1")
P2="$P1 $G1 $(ids 8)"
echo "turn2 prompt tokens: $(echo $P2 | wc -w)" >> $OUT
for i in 1 2 3; do
  drop; run "session-turn2-$i" --max-tokens 1 --session conv "$P2" >/dev/null
  drop; run "full-reprefill-$i" --max-tokens 1 "$P2" >/dev/null
done
t0=$(date +%s.%N); $R/k3 --socket $SOCK sessions save conv >> $OUT
echo "save wall $(echo "$(date +%s.%N) - $t0" | bc) s" >> $OUT
ls -l $SDIR >> $OUT
$R/k3 --socket $SOCK sessions list >> $OUT
kill -TERM $DPID; wait $DPID || true
t0=$(date +%s.%N); start_daemon; echo "daemon restarted, ready in $(echo "$(date +%s.%N) - $t0" | bc) s" >> $OUT
for i in 1 2 3; do
  drop; run "restored-session-turn2-$i" --max-tokens 1 --session "conv" "$P2" >/dev/null
  # Restart so the next measurement restores the session from its file again.
  if [ $i -lt 3 ]; then kill -TERM $DPID; wait $DPID || true; start_daemon; fi
done
kill -TERM $DPID; wait $DPID || true
cat $CG/memory.max_usage_in_bytes >> $OUT
grep -E "session \"conv\"|sessions:" $LOG >> $OUT
rmdir $CG
