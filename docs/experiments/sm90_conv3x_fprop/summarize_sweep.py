#!/usr/bin/env python3
"""Tables and one JSON file from run_sweep.sh's outputs (results.jsonl from sweep_bench, cudnn.json from
cudnn_fprop.py, build_summary.tsv from the build). Prints: the variants (static facts), a problem x variant
matrix of median us, and per problem the best verified variant against cuDNN and the old configuration."""
import argparse, json, math, os, sys

ap = argparse.ArgumentParser()
ap.add_argument("--results", required=True)
ap.add_argument("--cudnn", default=None)
ap.add_argument("--build", default=None)
ap.add_argument("--sass", default=None, help="sass_counts.tsv from run_sweep.sh")
ap.add_argument("--table", default=None, help="also write the printed tables here")
ap.add_argument("--json-out", default=None)
ap.add_argument("--baseline", default="orig_t128x64", help="variant that reproduces the old run.sh setup")
a = ap.parse_args()

variants, results = {}, []
if os.path.exists(a.results):
    for line in open(a.results):
        line = line.strip()
        if not line:
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            print("skipping bad line:", line[:120], file=sys.stderr)
            continue
        if d.get("kind") == "variant":
            variants[d["name"]] = d
        elif d.get("kind") == "result":
            results.append(d)

build = {}
if a.build and os.path.exists(a.build):
    rows = [l.rstrip("\n").split("\t") for l in open(a.build)]
    hdr = rows[0]
    for r in rows[1:]:
        if len(r) == len(hdr):
            build[r[0]] = dict(zip(hdr, r))

sass = {}
if a.sass and os.path.exists(a.sass):
    rows = [l.rstrip("\n").split("\t") for l in open(a.sass)]
    if rows and rows[0][0] == "id":
        for r in rows[1:]:
            if len(r) == len(rows[0]):
                sass[r[0]] = dict(zip(rows[0], r))

cudnn = None
if a.cudnn and os.path.exists(a.cudnn):
    cudnn = json.load(open(a.cudnn))

def pkey(d):
    return (d["n"], d["h"], d["c"], d["k"], d["r"], d["stride"])

problems = []
for d in results:
    if pkey(d) not in problems:
        problems.append(pkey(d))
gflop = {pkey(d): d["gflop"] for d in results}
cud = {}
if cudnn:
    for r in cudnn["rows"]:
        cud[pkey(r)] = r["us_median"]

names = sorted(set(variants) | {d["variant"] for d in results} | {k for k in build if k != "driver"},
               key=lambda s: (not s.startswith("orig"), s))
res = {(d["variant"], pkey(d)): d for d in results}

out = []
def p(s=""):
    out.append(s)
    print(s)

def plabel(k):
    n, h, c, kk, r, s = k
    return f"{n:5d} {h:2d}x{h:<2d} {c:3d}>{kk:<3d} {r}x{r}/{s}"

p("== variants (v#: id | configuration | regs/thread, spill bytes, dyn. smem KB, CTAs/SM from the occupancy API | build s, ptxas warnings"
  + (" | SASS HGMMA/DEPBAR/STG/UTMASTG/CALL" if sass else "") + ")")
for i, nm in enumerate(names):
    v = variants.get(nm, {})
    b = build.get(nm, {})
    st = "" if b.get("rc", "0") == "0" else f" BUILD FAILED rc={b.get('rc')}"
    p(f"v{i:02d} {nm:22s} {v.get('desc', '?'):62s} r{v.get('regs', b.get('regs', '?'))} sp{v.get('local_bytes', b.get('spill_stores', '?'))}"
      f" {v.get('smem_bytes', 0) / 1024:5.1f}KB occ{v.get('ctas_per_sm', '?')} | {b.get('seconds', '?')}s {b.get('warnings', '')}{st}"
      + (" | " + "/".join(sass[nm].get(c, "?") for c in ("HGMMA", "WARPGROUP.DEPBAR", "STG", "UTMASTG", "CALL")) if nm in sass else ""))
dev = next(iter(variants.values()), {}).get("device", "?")
p(f"device: {dev}" + (f"; cuDNN {cudnn['cudnn']} torch {cudnn['torch']}" if cudnn else "; no cuDNN numbers"))

p()
p("== median us per launch ('!' wrong result, '-' cannot implement, 'E' error, '.' not run); best verified in [ ]")
hdr = f"{'N':>5} {'HxW':5} {'C>K':7} {'RxS/s':5} " + f"{'cuDNN':>6}" + "".join(f"{'v%02d' % i:>7}" for i in range(len(names)))
p(hdr)
best = {}
for k in problems:
    oks = [(res[(nm, k)]["us_median"], nm) for nm in names if (nm, k) in res and res[(nm, k)]["status"] == "ok"]
    best[k] = min(oks) if oks else None
    cells = []
    for nm in names:
        d = res.get((nm, k))
        if d is None:
            c = "."
        elif d["status"] == "cannot":
            c = "-"
        elif d["status"] == "error":
            c = "E"
        else:
            us = d["us_median"]
            c = (f"{us:.0f}" if us >= 100 else f"{us:.1f}") + ("!" if d["status"] != "ok" else "")
            if best[k] and nm == best[k][1]:
                c = "[" + (f"{us:.0f}" if us >= 100 else f"{us:.1f}") + "]"
        cells.append(f"{c:>7}")
    cd = cud.get(k)
    p(f"{plabel(k)} {('%6.1f' % cd) if cd else '     ?'}" + "".join(cells))

p()
p("== ranking: geometric mean over problems of (variant us / cuDNN us), variants verified on every problem")
rank = []
for nm in names:
    rs = [res.get((nm, k)) for k in problems]
    if problems and all(r and r["status"] == "ok" for r in rs) and all(cud.get(k) for k in problems):
        g = math.exp(sum(math.log(r["us_median"] / cud[k]) for r, k in zip(rs, problems)) / len(problems))
        rank.append((g, nm))
for g, nm in sorted(rank)[:8]:
    p(f"  {nm:22s} {g:5.2f}x cuDNN")
if not rank:
    p("  (needs cuDNN numbers and a variant verified on every problem)")

p()
p(f"== per problem: best verified variant vs cuDNN and vs {a.baseline} (old run.sh 128x64 setup)")
p(f"{'N':>5} {'HxW':5} {'C>K':7} {'RxS/s':5} {'GFLOP':>6} {'cuDNN':>7} {'old':>7} {'best':>7} {'TFLOP/s':>7} {'best/cuDNN':>10} {'old/best':>8}  variant")
for k in problems:
    cd = cud.get(k)
    o = res.get((a.baseline, k))
    ous = o["us_median"] if o and o["status"] == "ok" else None
    b = best[k]
    if b:
        us, nm = b
        tf = gflop[k] / (us * 1e-6) * 1e-3
        p(f"{plabel(k)} {gflop[k]:6.2f} {('%7.1f' % cd) if cd else '      ?'} {('%7.1f' % ous) if ous else '      ?'} "
          f"{us:7.1f} {tf:7.0f} {('%10.2f' % (us / cd)) if cd else '         ?'} {('%8.2f' % (ous / us)) if ous else '       ?'}  {nm}")
    else:
        p(f"{plabel(k)} {gflop[k]:6.2f} {('%7.1f' % cd) if cd else '      ?'}  no verified variant")
nwrong = sum(1 for d in results if d["status"] in ("wrong", "error"))
p(f"results: {len(results)} (variant, problem) pairs, {nwrong} wrong or failed"
  + ("" if not nwrong else ": " + ", ".join(sorted({d['variant'] for d in results if d['status'] in ('wrong', 'error')}))))

if a.table:
    open(a.table, "w").write("\n".join(out) + "\n")
if a.json_out:
    json.dump(dict(device=dev, variants=[dict(variants.get(nm, {"name": nm}), build=build.get(nm), sass=sass.get(nm)) for nm in names],
                   results=results, cudnn=cudnn, best={" ".join(map(str, k)): best[k] for k in problems}),
              open(a.json_out, "w"), indent=1)
