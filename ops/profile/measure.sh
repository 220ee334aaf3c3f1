#!/bin/bash
# usage: ops/profile/measure.sh LABEL [burst]: triage bench pipeline on 127.0.0.1:9092 with
# py-spy recording the admission process and its CPU time after ready (OUT_DIR/LABEL)
cd "$(git rev-parse --show-toplevel)"
L=$1; B=${2:-20000}; O=${OUT_DIR:-/tmp/triage-profile}/$L; mkdir -p $O
.venv/bin/triage bench pipeline --json --bootstrap 127.0.0.1:9092 --repetitions 1 \
  --latency-rate ${RATE:-150} --latency-requests ${LAT:-1500} --burst-requests $B ${BENCH_ARGS:-} > $O/bench.json 2> $O/bench.err &
BP=$!
PID=""
for i in $(seq 1 600); do
  PID=$(pgrep -f "admission --config reports/bench-pipeline" | head -1); [ -n "$PID" ] && break; sleep 0.2
done
echo "admission pid $PID" > $O/cpu.txt
PORT=""  # the bench draws a free metrics port: read it off the process
until [ -n "$PORT" ] || ! kill -0 $PID 2>/dev/null; do
  PORT=$(ss -ltnp 2>/dev/null | grep "pid=$PID," | awk '{print $4}' | sed 's/.*://' | head -1); sleep 0.2
done
until curl -s 127.0.0.1:$PORT/metrics | grep -q "triage_admission_ready 1.0"; do sleep 0.3; kill -0 $PID 2>/dev/null || break; done
T0=$(awk '{print $14+$15}' /proc/$PID/stat); echo "ready_cpu_ticks $T0" >> $O/cpu.txt
threads() {  # per-thread CPU ticks (utime+stime) and name: tid comm ticks
  for t in /proc/$PID/task/*; do echo "${t##*/} $(tr ' ' _ < $t/comm) $(awk '{print $14+$15}' $t/stat)"; done 2>/dev/null
}
threads > $O/threads-ready.txt
.venv/bin/py-spy dump -p $PID > $O/threads-names.txt 2>&1
.venv/bin/py-spy record --nonblocking -r 100 ${PYSPY_ARGS:-} -p $PID --format raw -o $O/profile.txt > $O/pyspy.log 2>&1 &
SP=$!
(sleep 3; .venv/bin/py-spy dump -p $PID >> $O/threads-names.txt 2>&1) &  # threads started after ready
LAST=$T0
while kill -0 $PID 2>/dev/null; do
  LAST=$(awk '{print $14+$15}' /proc/$PID/stat 2>/dev/null || echo $LAST)
  threads >> $O/threads-end.txt  # every snapshot: a thread that ends early keeps its last
  sleep 0.2
done
echo "end_cpu_ticks $LAST" >> $O/cpu.txt
wait $BP; wait $SP
cat $O/bench.json; cat $O/cpu.txt
python3 - "$O" <<'PY'
import json,sys
o=sys.argv[1]; b=json.load(open(o+"/bench.json"))
c=dict(l.split()[0:2] for l in open(o+"/cpu.txt") if l.startswith(("ready","end")))
cpu=(int(c["end_cpu_ticks"])-int(c["ready_cpu_ticks"]))/100
n=b["burst_requests"]+b["latency_requests"]
print(f"admission CPU after ready: {cpu:.1f} s for {n} requests = {cpu/n*1e6:.0f} us/request")
import re
names = {}
for line in open(o + "/threads-names.txt"):  # py-spy dump: Thread <tid> (idle): "Name"
    m = re.match(r'Thread (\d+) \([^)]*\): "([^"]+)"', line)
    if m:
        names[m.group(1)] = m.group(2)
def ticks(f):  # tid -> (name, the most ticks any snapshot saw)
    out = {}
    for l in open(f):
        if len(l.split()) == 3:
            tid, name, n = l.split()
            if int(n) >= out.get(tid, ("", -1))[1]:
                out[tid] = (name, int(n))
    return out
a, b = ticks(o + "/threads-ready.txt"), ticks(o + "/threads-end.txt")
rows = sorted(((b[t][1] - a.get(t, ("", 0))[1], t, names.get(t, b[t][0])) for t in b), reverse=True)
total = sum(r[0] for r in rows) or 1
print("CPU by thread after ready (ticks of 10 ms; share of the process):")
for d, t, name in rows:
    if d > 0:
        print(f"  {d:6d}  {100 * d / total:5.1f}%  {name} (tid {t})")
PY
