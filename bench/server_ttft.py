#!/usr/bin/env python3
"""Time to first token of long prompts through `redlite serve` (issue 19's 32k-token bar).

Starts the server once with --ctx large enough for the longest prompt (and no prompt cache, so
every request prefills in full), then for each length of --prompt-tokens sends one greedy streamed
/v1/completions whose prompt is that many token ids (a fixed pseudo-random sequence; the prompt
as a token list, so its length is exact whatever the vocabulary), and reports time to first token
(client side: request sent to first streamed text), the prefill rate it implies and the decode
rate after it. Bounded: a socket timeout per request and a deadline for the run; the server is
always stopped. Prints one JSON object per length.

usage: bench/server_ttft.py --bin build/redlite -m MODEL [--backend cuda] [--prompt-tokens 4096,32768]
       [-n 16] [-- EXTRA SERVE FLAGS]
"""
import argparse, json, random, subprocess, sys, time

from server_client import free_port, stop, stream_completion, wait_healthy


def prompt_ids(n, vocab_lo, vocab_hi, seed):
    rng = random.Random(seed)
    return [rng.randrange(vocab_lo, vocab_hi) for _ in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/redlite")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--prompt-tokens", default="4096,32768", help="comma-separated prompt lengths in tokens")
    ap.add_argument("-n", type=int, default=16, help="tokens generated after each prompt")
    ap.add_argument("--token-range", default="100,4000", help="the prompt's token ids are drawn from [lo, hi)")
    ap.add_argument("--request-timeout-s", type=float, default=300)
    ap.add_argument("--deadline-s", type=float, default=900, help="the whole run's limit")
    ap.add_argument("serve_flags", nargs="*", help="extra flags for redlite serve (after --)")
    a = ap.parse_args()
    lengths = [int(x) for x in a.prompt_tokens.split(",")]
    if any(n < 1 for n in lengths):
        ap.error("--prompt-tokens: each length must be at least 1")
    lo, hi = (int(x) for x in a.token_range.split(","))
    if not 0 <= lo < hi:
        ap.error("--token-range: want lo,hi with 0 <= lo < hi")
    deadline = time.monotonic() + a.deadline_s
    ctx = max(lengths) + a.n + 64
    port = free_port()
    cmd = [a.bin, "serve", "-m", a.model, "--port", str(port), "--backend", a.backend, "--ctx", str(ctx),
           "--prompt-cache-mib", "0"] + a.serve_flags
    srv = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, srv, max(1.0, deadline - time.monotonic()))
        stream_completion(port, "Warm up.", 4, a.request_timeout_s)
        for i, n in enumerate(lengths):
            left = deadline - time.monotonic()
            if left < 1:
                raise RuntimeError("the run's deadline passed")
            r = stream_completion(port, prompt_ids(n, lo, hi, 1000 + i), a.n, min(left, a.request_timeout_s))
            row = {"prompt_tokens": n, "ctx": ctx, "ttft_s": round(r["ttft_s"], 3),
                   "prefill_tok_s_implied": round(n / r["ttft_s"], 1) if r["ttft_s"] > 0 else 0.0,
                   "completion_tokens": r["tokens"], "decode_tok_s_client": round(r["client_tok_s"], 1),
                   "model": a.model, "backend": a.backend}
            print(json.dumps(row), flush=True)
    finally:
        stop(srv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
