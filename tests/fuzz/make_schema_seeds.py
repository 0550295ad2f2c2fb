#!/usr/bin/env python3
"""Seeds for fuzz_json_constraint: each schema of tests/generate/data/schema_corpus.json, a zero
byte, then 64 random steering bytes (seeded, so the same files every run).

usage: tests/fuzz/make_schema_seeds.py OUT_DIR
"""
import json, os, random, sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(ROOT, "tests/generate/data/schema_corpus.json")) as f:
        corpus = json.load(f)
    rng = random.Random(1)
    for i, schema in enumerate(corpus):
        steer = bytes(rng.randrange(256) for _ in range(64))
        with open(os.path.join(out, "s%03d" % i), "wb") as f:
            f.write(json.dumps(schema).encode() + b"\0" + steer)
    print(f"{len(corpus)} seeds in {out}")


if __name__ == "__main__":
    main()
