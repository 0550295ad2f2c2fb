"""The bench scripts' client for `redlite serve` (stdlib only): a free port, waiting for /health,
and one streamed completion timed from the client side."""
import http.client, json, socket, subprocess, time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def stop(srv, timeout_s=30):
    """Stops a server started with subprocess.Popen: SIGTERM, then SIGKILL after timeout_s."""
    srv.terminate()
    try:
        srv.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        srv.kill()


def wait_healthy(port, srv, timeout_s=60):
    """Waits until /health answers 200; raises when the server exits or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if srv.poll() is not None:
            raise RuntimeError(f"the server exited with {srv.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the server did not become ready in time")


def stream_completion(port, prompt, n, timeout_s=600):
    """A greedy streamed /v1/completions of n tokens: start and end times, time to first token,
    completion tokens (from the usage chunk), client-side tok/s from the first token on, and the
    arrival time of each event that carried text (a token's, or a few held back together)."""
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    first, usage, buf, text_times = None, None, b"", []
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: ") or event[6:] == b"[DONE]":
                continue
            j = json.loads(event[6:])
            if j.get("usage"):
                usage = j["usage"]
            if any(c.get("text") for c in j.get("choices", [])):
                text_times.append(time.perf_counter())
                if first is None:
                    first = text_times[-1]
    end = time.perf_counter()
    conn.close()
    tokens = usage["completion_tokens"] if usage else 0
    first = first or end
    return {"start": t0, "end": end, "first": first, "ttft_s": first - t0, "tokens": tokens, "text_times": text_times,
            "client_tok_s": (tokens - 1) / (end - first) if tokens > 1 and end > first else 0.0}
