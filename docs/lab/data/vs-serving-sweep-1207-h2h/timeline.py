import json, sys, time, glob, os
off = time.time() - time.monotonic()
run = sys.argv[1]
t0 = json.load(open(os.path.join(os.path.dirname(run.rstrip('/')), 'results.json')))['dsdprof']['t0'] if len(sys.argv) < 3 else float(sys.argv[2])
ev = []
for f in sorted(glob.glob(run + '/_traces/*.jsonl')):
    for i, line in enumerate(open(f)):
        steps = json.loads(line)
        if not steps: continue
        a, b = steps[0]['t_end'] + off - t0, steps[-1]['t_end'] + off - t0
        ev.append((a, b, os.path.basename(f), i, steps[0].get('wave'), len(steps)))
for a, b, f, i, w, n in sorted(ev):
    print(f"{a:7.1f} {b:7.1f} {b-a:6.1f}  {f:28s} line{i} wave {w} steps {n}")
