# first occurrence of each decode shape vs its later occurrences, per engine (rollout traces, r0..r2 in order)
import json, sys, glob, os, statistics as st, collections
ratios = collections.defaultdict(list)
for run in sys.argv[1:]:
    for var in sorted({os.path.basename(f).rsplit('-r', 1)[0] for f in glob.glob(run + '/_traces/rollout-*.jsonl')}):
        seen = {}
        occ = collections.defaultdict(list)
        order = []
        for r in range(10):
            f = f"{run}/_traces/{var}-r{r}.jsonl"
            if not os.path.exists(f): break
            for line in open(f):
                steps = json.loads(line)
                for a, b in zip(steps, steps[1:]):
                    if b['prefill_tokens'] or b['decoding'] != b['scheduled'] or b['decoding'] == 0: continue
                    k = max(b['drafted']) if b['drafted'] else 0
                    key = (b['decoding'], k)
                    dt = b['t_end'] - a['t_end']
                    if key not in seen: seen[key] = len(occ[key])
                    occ[key].append(dt)
        for key, xs in occ.items():
            if len(xs) >= 6:
                ratios[var.split('-')[1]].append((xs[0] / st.median(xs[1:]), xs[1] / st.median(xs[2:]), xs[2]/st.median(xs[3:]), key, len(xs)))
for v, rs in ratios.items():
    r0 = [x[0] for x in rs]; r1 = [x[1] for x in rs]; r2 = [x[2] for x in rs]
    print(f"{v:9s} shapes {len(rs):3d}  1st/median(rest) median {st.median(r0):.2f} max {max(r0):.2f} | 2nd {st.median(r1):.2f} max {max(r1):.2f} | 3rd {st.median(r2):.2f}")
if os.environ.get('DETAIL'):
    for v, rs in ratios.items():
        for r in sorted(rs, key=lambda x: x[3]):
            print(v, r[3], 'n', r[4], 'first3/median(rest):', round(r[0], 2), round(r[1], 2), round(r[2], 2))
