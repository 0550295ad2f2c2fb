#!/usr/bin/env python3
"""Independent check of constrained outputs: each input line is a JSON object
{"schema": ..., "text": "..."}; the text must parse with Python's json and validate against the
schema with jsonschema (Draft 2020-12). Prints one line per failure; exits 1 if any failed,
2 when jsonschema is missing."""
import json
import sys

try:
    import jsonschema
except ImportError:
    print("python3-jsonschema is not installed", file=sys.stderr)
    sys.exit(2)

failures = 0
count = 0
with open(sys.argv[1], encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
        case = json.loads(line)
        count += 1
        try:
            doc = json.loads(case["text"])
            jsonschema.Draft202012Validator(case["schema"]).validate(doc)
        except (ValueError, jsonschema.ValidationError) as e:
            failures += 1
            print(f"case {n}: {type(e).__name__}: {str(e).splitlines()[0]} -- text {case['text']!r}")
print(f"{count} documents checked, {failures} invalid")
sys.exit(1 if failures else 0)
