"""Times Python's loop any(fnmatch.fnmatchcase(req, g) for g in grants) on the
benchmark fixtures, for comparison with BenchmarkCheck*. Run from the
permissions directory: python3 testdata/python_baseline.py"""
import fnmatch, timeit

for name in ("grants1000.txt", "grants100_nomatch.txt"):
    with open("testdata/" + name) as f:
        lines = f.read().strip().split("\n")
    req = lines[0].removeprefix("# required: ")
    grants = lines[1:]
    loop = lambda: any(fnmatch.fnmatchcase(req, g) for g in grants)
    loop()  # warm fnmatch's pattern cache
    n, total = timeit.Timer(loop).autorange()
    best = min(timeit.repeat(loop, number=n, repeat=5)) / n
    print(f"{name}: {len(grants)} grants, allowed={loop()}, {best * 1e9:.0f} ns/op")
