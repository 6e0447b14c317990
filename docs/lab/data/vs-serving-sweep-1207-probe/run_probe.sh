#!/bin/bash
# H4 session 7: the variable-length probe (issue 43 part 3). Waits for the lead's "lock free for H4" line
# in NOTES.md, then takes vllm.lock; no run starts that would end after 06:36:45; hard stop 06:38:00
# (INT -> the probe's finally stops both servers), watchdog kills leftover server groups; lock out by 06:40.
OUT=/tmp/h4s7/probe; WT=/tmp/h4s7/wt; T=/tmp/h4s7/timing.txt
PROBE=/work/main/docs/lab/data/vs-serving-sweep-1207-settle/probe_variable_lengths.py
mkdir -p $OUT
echo "$(date -u +%T) armed; $(uptime)" >> $T
until grep -q '^LEAD [0-9:]*: lock free for H4' /tmp/coord/NOTES.md; do sleep 5; done
echo "$(date -u +%T) lead's line seen" >> $T
flock /tmp/vllm.lock bash -c '
  T='$T'; OUT='$OUT'; WT='$WT'; PROBE='$PROBE'
  echo "$(date -u +%T) LOCK TAKEN; $(uptime); EngineCore $(ps aux | grep -c [E]ngineCore)" >> $T
  left=$(( $(date -u -d "06:38:00" +%s) - $(date -u +%s) ))
  if [ $left -lt 480 ]; then echo "$(date -u +%T) probe skipped: ${left}s left" >> $T; exit 0; fi
  cd $WT && STOP_BY=$(date -u -d "06:36:45" +%s) BENCH_ROOT=$WT PYTHONPATH=$WT timeout -s INT -k 50 $left \
    /work/main/.venv/bin/python $PROBE $OUT 2 2 4 > $OUT/probe.log 2>&1
  rc=$?
  if [ -f $OUT/servers.json ]; then
    for pid in $(/work/main/.venv/bin/python -c "import json; print(*json.load(open(\"$OUT/servers.json\")).values())"); do
      kill -KILL -- -$pid 2>/dev/null && echo "$(date -u +%T) watchdog killed group $pid" >> $T; done
    sleep 3
  fi
  echo "$(date -u +%T) probe rc $rc; $(uptime); EngineCore $(ps aux | grep -c [E]ngineCore)" >> $T
  echo "$(date -u +%T) LOCK RELEASED" >> $T
'
