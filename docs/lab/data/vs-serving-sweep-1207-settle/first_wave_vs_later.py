import json, sys, statistics as st, glob
for f in sorted(glob.glob('/tmp/h1s7/settle/guidellm/baseline-*.json')):
    b = json.load(open(f))['benchmarks'][0]
    t0 = b['scheduler_metrics']['request_start_time']
    rs = sorted(b['requests']['successful'], key=lambda r: r['info']['timings']['request_start'])
    def step(group):
        return sum(r['info']['timings']['last_request_iteration'] - r['info']['timings']['first_request_iteration'] for r in group) / sum(r['info']['timings']['request_iterations'] - 3 for r in group)
    first, later = rs[:16], rs[16:]
    lat = lambda g: st.fmean(r['info']['timings']['request_end'] - r['info']['timings']['request_start'] for r in g)
    ttft = lambda g: st.fmean(r['info']['timings']['first_request_iteration'] - r['info']['timings']['request_start'] for r in g)
    print(f.split('/')[-1][9:-5].ljust(22), f"step first wave {step(first):.4f} later {step(later):.4f} ratio {step(later)/step(first):.3f}; latency {lat(first):5.2f} {lat(later):5.2f}; ttft {ttft(first):4.2f} {ttft(later):4.2f}")
