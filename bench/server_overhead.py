#!/usr/bin/env python3
"""Streaming overhead of `redlite serve` against `redlite run` on the same model and prompt.

Starts the server on a free loopback port, streams greedy completions through it (stdlib HTTP
client, SSE), and reports per request: time to first token (client side), client-side tok/s over
the stream, and the engine's own decode tok/s from the response's timings; then runs `redlite run`
with the same prompt and token count and reads its generation tok/s from stderr. Prints one JSON
object (medians over --reps).

usage: bench/server_overhead.py --bin build/redlite -m MODEL [--backend cpu] [-n 64] [--reps 5]
"""
import argparse, http.client, json, re, socket, statistics, subprocess, sys, time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def stream_completion(port, prompt, n):
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    first = None
    usage = None
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue
            data = event[6:]
            if data == b"[DONE]":
                continue
            j = json.loads(data)
            if j.get("usage"):
                usage = j["usage"]
            if any(c.get("text") for c in j.get("choices", [])) and first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    conn.close()
    tokens = usage["completion_tokens"] if usage else 0
    return {"ttft_s": first - t0, "client_tok_s": (tokens - 1) / (end - first) if tokens > 1 else 0.0,
            "tokens": tokens}


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
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        stream_completion(port, a.prompt, 4)  # warm-up
        runs = [stream_completion(port, a.prompt, a.n) for _ in range(a.reps)]
    finally:
        srv.terminate()
        srv.wait(timeout=30)

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
