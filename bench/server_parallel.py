#!/usr/bin/env python3
"""Concurrent streams through `redlite serve --parallel N` (continuous batching).

For each N of --streams, starts the server with `--parallel N` on a free loopback port, sends N
greedy streamed completions at once (stdlib HTTP client, SSE, one thread per stream, each with its
own prompt so no state is shared), and reports: aggregate tok/s (all streams' generated tokens over
the wall time from the first request to the last stream's end, the prompts' prefills included),
the decode window's aggregate (the tokens that arrived while every stream was decoding, from the
last stream's first token to the first stream's end, over that time: the batched decode alone;
a stream's tokens counted by its text events, scaled by its tokens per event), per-stream tok/s
(client side, first token to last) and time to first token (min, median, max). Bounded: every request has a
socket timeout and the whole run a deadline (--deadline-s); the server is always stopped.
Prints one JSON object per N, and their list at the end.

usage: bench/server_parallel.py --bin build/redlite -m MODEL [--backend cpu] [--streams 1,4]
       [--parallel P] [-n 128] [--threads 0] [-- EXTRA SERVE FLAGS]
"""
import argparse, json, statistics, subprocess, sys, threading, time

from server_client import free_port, stop, stream_completion, wait_healthy


def run_streams(a, n_streams, deadline):
    port = free_port()
    cmd = [a.bin, "serve", "-m", a.model, "--port", str(port), "--backend", a.backend, "--threads", a.threads,
           "--parallel", str(a.parallel or n_streams), "--prompt-cache-mib", "0"] + a.serve_flags
    srv = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, srv, max(1.0, deadline - time.monotonic()))
        stream_completion(port, "Warm up.", 4, a.request_timeout_s)
        left = max(1.0, deadline - time.monotonic())
        results, errors = [None] * n_streams, []

        def one(i):
            try:
                results[i] = stream_completion(port, f"{a.prompt} (stream {i})", a.n, min(left, a.request_timeout_s))
            except Exception as e:  # reported, not raised from a thread
                errors.append(f"stream {i}: {e}")

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n_streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        if errors or any(r is None for r in results):
            raise RuntimeError("; ".join(errors) or "a stream did not finish before the deadline")
    finally:
        stop(srv)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    ttft = [r["ttft_s"] for r in results]
    window = decode_window(results)
    return {"streams": n_streams, "parallel": a.parallel or n_streams, "tokens_requested": a.n, "tokens_generated": tokens,
            "wall_s": round(wall, 3), "aggregate_tok_s": round(tokens / wall, 2),
            "per_stream_tok_s_median": round(statistics.median(r["client_tok_s"] for r in results), 2),
            "per_stream_tok_s_min": round(min(r["client_tok_s"] for r in results), 2),
            "ttft_ms_min": round(1000 * min(ttft), 1), "ttft_ms_median": round(1000 * statistics.median(ttft), 1),
            "ttft_ms_max": round(1000 * max(ttft), 1), **window}


def decode_window(results):
    """The tokens that arrived while every stream was decoding (the last first token to the first
    end), over that time; empty when no such window exists."""
    a, b = max(r["first"] for r in results), min(r["end"] for r in results)
    if b <= a:
        return {}
    tokens = 0.0
    for r in results:
        events = r["text_times"]
        if events:
            tokens += sum(a <= t <= b for t in events) * r["tokens"] / len(events)
    return {"decode_window_s": round(b - a, 3), "decode_window_tok_s": round(tokens / (b - a), 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/redlite")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--threads", default="0")
    ap.add_argument("--streams", default="1,4", help="comma-separated stream counts (1-16), each with --parallel N")
    ap.add_argument("--parallel", type=int, default=0,
                    help="the server's --parallel for every count (default: the stream count; 1 gives the "
                         "one-at-a-time baseline)")
    ap.add_argument("-n", type=int, default=128, help="tokens per stream")
    ap.add_argument("-p", "--prompt", default="The quick brown fox jumps over the lazy dog.")
    ap.add_argument("--request-timeout-s", type=float, default=600)
    ap.add_argument("--deadline-s", type=float, default=1800, help="the whole run's limit")
    ap.add_argument("serve_flags", nargs="*", help="extra flags for redlite serve (after --)")
    a = ap.parse_args()
    counts = [int(x) for x in a.streams.split(",")]
    if any(c < 1 or c > 16 for c in counts):
        ap.error("--streams: each count must be between 1 and 16")
    deadline = time.monotonic() + a.deadline_s
    out = []
    for n in counts:
        r = run_streams(a, n, deadline)
        r.update({"model": a.model, "backend": a.backend})
        print(json.dumps(r), flush=True)
        out.append(r)
    base = next((r for r in out if r["streams"] == 1), None)
    if base:
        for r in out:
            r["aggregate_vs_one_stream"] = round(r["aggregate_tok_s"] / base["aggregate_tok_s"], 2)
            if "decode_window_tok_s" in r and "decode_window_tok_s" in base:
                r["decode_window_vs_one_stream"] = round(r["decode_window_tok_s"] / base["decode_window_tok_s"], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())
