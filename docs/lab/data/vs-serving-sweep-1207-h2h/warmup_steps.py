# warm-up (wave -1) and first measured wave steps against the measured waves' median of the same step kind
import json, sys, glob, os, statistics as st, collections
run = sys.argv[1]
for f in sorted(glob.glob(run + '/_traces/*.jsonl')):
    waves = [json.loads(l) for l in open(f)]
    rows = []  # (wave, idx, key, dt)
    for steps in waves:
        for i, (a, b) in enumerate(zip(steps, steps[1:])):
            if b['prefill_tokens'] or b['decoding'] != b['scheduled'] or b['decoding'] == 0 or a['wave'] != b['wave']:
                continue
            key = (tuple(sorted(set(b['drafted']))), b.get('k_next'), b['decoding'])
            rows.append((b['wave'], i, key, b['t_end'] - a['t_end']))
    med = {}
    by = collections.defaultdict(list)
    for w, i, k, dt in rows:
        if w >= 1: by[k].append(dt)   # waves 1.. as the reference
    med = {k: st.median(v) for k, v in by.items() if len(v) >= 3}
    print(os.path.basename(f))
    for w in sorted({r[0] for r in rows}):
        rs = [(i, dt / med[k]) for ww, i, k, dt in rows if ww == w and k in med]
        if not rs: continue
        first = [f"{x:.2f}" for _, x in rs[:10]]
        print(f"   wave {w:2d}: {len(rs):3d} steps, median ratio {st.median(x for _, x in rs):.3f}; first 10: {' '.join(first)}")
