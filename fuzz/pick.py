#!/usr/bin/env python3
"""Picks the committed corpus of a target: greedy max-coverage choice of at most CAP
inputs from a libFuzzer merge control file (its COV lines: the edges each input covers).
Usage (README.md, "Minimizing"): pick.py CONTROL_FILE OUT_DIR CAP"""
import os, shutil, sys
ctl, out, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
lines = open(ctl).read().split("\n")
n = int(lines[0]); files = lines[2:2 + n]
cov = {}
for l in lines[2 + n:]:
    p = l.split()
    if p and p[0] == "COV":
        cov[int(p[1])] = set(map(int, p[2:]))
total = set().union(*cov.values()) if cov else set()
got, pick = set(), []
while len(pick) < cap:
    best = max(cov, key=lambda i: (len(cov[i] - got), -os.path.getsize(files[i])), default=None)
    if best is None or not (cov[best] - got):
        break
    got |= cov[best]; pick.append(best); del cov[best]
os.makedirs(out, exist_ok=True)
for i in pick:
    src = files[i]
    name = os.path.basename(src)
    shutil.copy(src, os.path.join(out, name))
print(f"{len(pick)} files cover {len(got)}/{len(total)} edges ({100*len(got)/max(1,len(total)):.1f}%)")
