#!/usr/bin/env python3
"""Per-kernel statistics of a CUDA source without a GPU: the PTX instructions of each kernel (by
kind) and what ptxas gives it (registers, spill bytes, static shared memory), for reading a
kernel change on the development machine before a device call (e.g. whether a loop is unrolled:
its PTX grows; whether a launch bound spills).

usage: scripts/ptx_stats.py FILE.cu [--filter REGEX] [-D NAME[=VALUE] ...] [--arch sm_90a] [--nvcc PATH]
  FILE.cu    a source of src/cuda (compiled with the build's flags: -O3, C++20, -I src)
  --filter   only the kernels whose demangled name matches REGEX
  -D         a macro for the compile (a variant to compare)
  --arch     the target (default sm_90a, the GPU host's)
  --nvcc     the compiler (default /usr/local/cuda/bin/nvcc)

PTX is what nvcc hands ptxas, not the machine code: ptxas folds some instructions and schedules
the rest, so the counts compare two versions of a kernel, they do not time it.
"""
import argparse, collections, os, re, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = [("mma", r"\bmma\b|\bwmma\b"), ("ld.global", r"\bld\.global"), ("ld.shared", r"\bld\.shared"),
         ("st.shared", r"\bst\.shared"), ("cp.async", r"\bcp\.async\b"), ("branch", r"\bbra\b"),
         ("barrier", r"\bbar\.|\bbarrier\.")]


def compile_args(arch, defines):
    flags = ["-DREDLITE_HAVE_CUDA=1", "-I" + os.path.join(ROOT, "src"), "-O3", "-DNDEBUG", "-std=c++20",
             "--expt-relaxed-constexpr"] + ["-D" + d for d in defines]
    virt = "compute_" + arch[3:]
    return flags, virt


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"ptx_stats: {' '.join(cmd[:2])} failed:\n{p.stderr}")
    return p.stderr


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
        return dict(zip(names, out))
    except OSError:
        return {n: n for n in names}


def ptx_entries(ptx):
    """name -> list of instruction lines of each .entry."""
    entries = {}
    for m in re.finditer(r"\.entry (\S+)\(", ptx):
        end = ptx.index("\n}\n", m.start())
        lines = [l.strip() for l in ptx[m.start():end].split("\n")]
        entries[m.group(1)] = [l for l in lines if l and not l.startswith(("$", "//", ".", "{", "}", ")", "("))
                               and l.endswith(";")]
    return entries


def ptxas_info(log):
    """name -> (registers, spill store bytes, static shared bytes) from -Xptxas -v."""
    info, name = {}, None
    for line in log.split("\n"):
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            name = m.group(1)
            info[name] = [0, 0, 0]
            continue
        if name is None:
            continue
        m = re.search(r"(\d+) bytes spill stores", line)
        if m:
            info[name][1] = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            info[name][0] = int(m.group(1))
        m = re.search(r"(\d+) bytes smem", line)
        if m:
            info[name][2] = int(m.group(1))
    return info


def short_name(name):
    """The demangled name less its return type, namespaces and parameter list."""
    name = name.replace("rl::cuda::", "").replace("(anonymous namespace)::", "").replace("rl::", "")
    name = re.sub(r"^void ", "", name)
    if name.endswith(")"):  # drop the last top-level parenthesised group: the parameters
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    return name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source")
    ap.add_argument("--filter", default="")
    ap.add_argument("-D", dest="defines", action="append", default=[])
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--nvcc", default="/usr/local/cuda/bin/nvcc")
    a = ap.parse_args()
    if not re.fullmatch(r"sm_\d+a?", a.arch):
        sys.exit(f"ptx_stats: --arch {a.arch}: expected sm_NN or sm_NNa")
    if not os.path.isfile(a.source):
        sys.exit(f"ptx_stats: no file {a.source}")
    flags, virt = compile_args(a.arch, a.defines)
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path, obj = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.o")
        run([a.nvcc, *flags, f"--generate-code=arch={virt},code=[{virt}]", "-ptx", "-x", "cu", a.source, "-o", ptx_path])
        log = run([a.nvcc, *flags, f"--generate-code=arch={virt},code=[{a.arch}]", "-Xptxas", "-v", "-x", "cu", "-c",
                   a.source, "-o", obj])
        ptx = open(ptx_path).read()
    entries, info = ptx_entries(ptx), ptxas_info(log)
    names = demangle(list(entries))
    rows = []
    for mangled, lines in entries.items():
        name = names.get(mangled, mangled)
        if a.filter and not re.search(a.filter, name):
            continue
        kinds = collections.Counter()
        for l in lines:
            for k, rx in KINDS:
                if re.search(rx, l):
                    kinds[k] += 1
        regs, spill, smem = info.get(mangled, ["?", "?", "?"])
        rows.append((name, len(lines), kinds, regs, spill, smem))
    if not rows:
        sys.exit("ptx_stats: no kernel matches" + (f" --filter {a.filter}" if a.filter else ""))
    head = ["ptx", *[k for k, _ in KINDS], "regs", "spill", "smem"]
    print(" ".join(f"{h:>9}" for h in head) + "  kernel")
    for name, n, kinds, regs, spill, smem in rows:
        cells = [n, *[kinds[k] for k, _ in KINDS], regs, spill, smem]
        print(" ".join(f"{c:>9}" for c in cells) + "  " + short_name(name))


if __name__ == "__main__":
    main()
