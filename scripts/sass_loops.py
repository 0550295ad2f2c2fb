#!/usr/bin/env python3
"""Machine instructions of a CUDA source's kernels without a GPU: each kernel's loops (a backward
branch and what lies between its target and it) with their instruction counts by opcode, from the
SASS of the build's PTX. The development machine's CUDA 13 has no disassembler, and the CUDA 11.8
one (Debian non-free's nvidia-cuda-toolkit) reads neither CUDA 13's cubins nor its newest PTX, so
the PTX (compiled as the build does) is relabelled PTX 7.8 for sm_90 with its
`cp.async.bulk.prefetch` lines (L2 prefetch hints, unknown to that ptxas) dropped, then assembled
and disassembled by the old tools. The counts compare two versions of a kernel; they are not the
shipped code's (another ptxas) and they time nothing.

usage: scripts/sass_loops.py FILE.cu [--filter REGEX] [--tools DIR] [--min N] [--nvcc PATH] [-D NAME[=VALUE] ...]
  FILE.cu    a source of src/cuda
  --filter   only the kernels whose mangled name matches REGEX
  --tools    the directory holding the old ptxas and cuobjdump (default /tmp/cudatk/x/usr/bin)
  --min      the smallest loop printed, in instructions (default 20)
  --nvcc     the compiler of the PTX (default /usr/local/cuda/bin/nvcc)
  -D         a macro for the compile

The old tools, once (no install):
  echo 'Types: deb
  URIs: http://deb.debian.org/debian
  Suites: bookworm
  Components: contrib non-free
  Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' > /etc/apt/sources.list.d/nonfree.sources
  apt-get update && mkdir -p /tmp/cudatk && cd /tmp/cudatk && apt-get download nvidia-cuda-toolkit &&
    dpkg -x nvidia-cuda-toolkit_*.deb x
"""
import argparse, collections, os, re, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"sass_loops: {os.path.basename(cmd[0])} failed:\n{p.stderr[-2000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(usage=__doc__.split("usage: ", 1)[1].split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--filter", default="")
    ap.add_argument("--tools", default="/tmp/cudatk/x/usr/bin")
    ap.add_argument("--min", type=int, default=20)
    ap.add_argument("--nvcc", default="/usr/local/cuda/bin/nvcc")
    ap.add_argument("-D", action="append", default=[])
    args = ap.parse_args()
    ptxas, cuobjdump = (os.path.join(args.tools, t) for t in ("ptxas", "cuobjdump"))
    for t in (ptxas, cuobjdump):
        if not os.access(t, os.X_OK):
            sys.exit(f"sass_loops: no {t} (the old tools: see --help)")
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        run([args.nvcc, "-DREDLITE_HAVE_CUDA=1", "-I" + os.path.join(ROOT, "src"), "-O3", "-DNDEBUG", "-std=c++20",
             "--expt-relaxed-constexpr", "-arch=sm_90a", "-ptx", "-o", ptx, args.file] + ["-D" + d for d in args.D])
        text = open(ptx).read()
        text = re.sub(r"^\.version .*$", ".version 7.8", text, count=1, flags=re.M)
        text = re.sub(r"^\.target sm_90a", ".target sm_90", text, count=1, flags=re.M)
        text = "\n".join(l for l in text.split("\n") if "cp.async.bulk.prefetch" not in l)
        open(ptx, "w").write(text)
        run([ptxas, "-arch=sm_90", "-O3", ptx, "-o", cubin])
        sass = run([cuobjdump, "-sass", cubin])
    for f in re.split(r"\n\s*Function : ", sass)[1:]:
        name = f.split("\n", 1)[0].strip()
        if not re.search(args.filter, name):
            continue
        ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", f)]
        print(f"{len(ins):6d} instructions  {name}")
        for addr, text in ins:
            m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
            if not m or int(m.group(1), 16) >= addr:
                continue
            start = int(m.group(1), 16)
            body = [t for a, t in ins if start <= a <= addr]
            if len(body) < args.min:
                continue
            ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
            print(f"{len(body):6d} in the loop {start:#x}-{addr:#x}: " +
                  ", ".join(f"{k} {v}" for k, v in ops.most_common(16)))


if __name__ == "__main__":
    main()
