#!/usr/bin/env python3
"""Streaming overhead of `redlite serve` against `redlite run` on the same model and prompt.

Starts the server on a free loopback port, streams greedy completions through it (stdlib HTTP
client, SSE), and reports per request: time to first token (client side), client-side tok/s over
the stream, and the engine's own decode tok/s from the response's timings; then runs `redlite run`
with the same prompt and token count and reads its generation tok/s from stderr. Prints one JSON
object (medians over --reps).

usage: bench/server_overhead.py --bin build/redlite -m MODEL [--backend cpu] [-n 64] [--reps 5]
"""
import argparse, re, statistics, subprocess, sys

from server_client import free_port, stop, stream_completion, wait_healthy


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/redlite")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--threads", default="0")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-p", "--prompt", default="The quick brown fox jumps over the lazy dog.")
    a = ap.parse_args()

    port = free_port()
    srv = subprocess.Popen([a.bin, "serve", "-m", a.model, "--port", str(port), "--backend", a.backend,
                            "--threads", a.threads, "--prompt-cache-mib", "0"],
                           stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, srv)
        stream_completion(port, a.prompt, 4)  # warm-up
        runs = [stream_completion(port, a.prompt, a.n) for _ in range(a.reps)]
    finally:
        stop(srv)

    run_tok_s = []
    for _ in range(a.reps):
        r = subprocess.run([a.bin, "run", "-m", a.model, "-p", a.prompt, "-n", str(a.n), "--temp", "0",
                            "--backend", a.backend, "--threads", a.threads],
                           capture_output=True, text=True, errors="replace", check=True)
        m = re.search(r"generation: \d+ tokens, ([0-9.]+) tok/s", r.stderr)
        run_tok_s.append(float(m.group(1)))

    med = lambda xs: statistics.median(xs)
    out = {"model": a.model, "backend": a.backend, "tokens": a.n, "reps": a.reps,
           "server_ttft_ms": 1000 * med([r["ttft_s"] for r in runs]),
           "server_stream_tok_s": med([r["client_tok_s"] for r in runs]),
           "run_tok_s": med(run_tok_s)}
    out["overhead_pct"] = 100 * (out["run_tok_s"] - out["server_stream_tok_s"]) / out["run_tok_s"]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())
