#!/usr/bin/env python3
"""Reference renderer for the chat-template tests: Python's jinja2 set up as Hugging Face
transformers sets it up for chat templates (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loop controls, tojson = json.dumps(ensure_ascii=False), raise_exception and
strftime_now globals).

Input (argv[1]): a JSON list of cases {"template": path, "context": {...}}.
Output (stdout): a JSON list, per case {"ok": text} or {"error": message}.
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    compiled = {}
    out = []
    for case in cases:
        path = case["template"]
        if path not in compiled:
            with open(path, encoding="utf-8") as f:
                compiled[path] = env.from_string(f.read())
        try:
            out.append({"ok": compiled[path].render(**case["context"])})
        except Exception as e:  # the test compares failures too
            out.append({"error": f"{type(e).__name__}: {e}"})
    sys.stdout.write(json.dumps(out, ensure_ascii=False))


main()
