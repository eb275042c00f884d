#!/usr/bin/env python3
"""Estimated speed-up of exact n-gram speculation from per-step counts (issue 16 item 4).

Input: `k3d run --json` outputs (one JSON object per file) of the same prompt, one with
`--speculate 0` (plain) and any number with `--speculate N`, plus a cost table c(d): the time of
a decode forward carrying d drafted ids (d + 1 fed tokens) relative to a plain 1-token forward,
c(0) = 1. The table comes either from `--cost c1,c2,...` (c(1), c(2), ... in that order) or from
`k3d bench --json --prompt-tokens K` documents (`--bench FILE`, once per K), where a K-token prefill
prices a verify step of d = K - 1 drafts: c(d) = median prefill seconds / median decode seconds
per token of the same budget (`--budget` picks it by its `--ram-gb` text when a document has
several). The prefill is its process's first forward (colder caches than decode's); a K = 1
document, a plain forward in the prefill's place, measures that bias: when given, every c(d) is
divided by its ratio.

For each speculative run it prints the decoded ids (those after the first, which the prompt's
logits give), the decode forwards and their drafts histogram (`drafts_per_forward[d]`), ids per
forward, drafts accepted per verify step, the estimated speed-up on the priced machine =
decoded ids / sum over forwards of c(d_forward) (plain greedy needs one forward per decoded id,
each costing c(0) = 1), and the wall-clock decode tokens/s of the run against the plain one
(on the machine where the runs were made, not the priced one).

Python 3 standard library only. Example:

    k3d run tests/fixtures/trained/model --prompt "$P" --gen 128 --json > off.json
    k3d run tests/fixtures/trained/model --prompt "$P" --gen 128 --json --speculate 4 > on4.json
    python3 tools/speculation_speedup.py --plain off.json --cost 1.05,1.1,1.15,1.2 on4.json
    for k in 2 3 4 5; do k3d bench MODEL --ram-gb 4.75 --prompt-tokens $k --json > b$k.json; done
    python3 tools/speculation_speedup.py --plain off.json --bench b2.json --bench b3.json \
        --bench b4.json --bench b5.json on4.json
"""

import argparse
import json
import sys


def fail(message):
    sys.exit(f"speculation_speedup: {message}")


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")


def field(doc, key, path):
    if key not in doc:
        fail(f"{path}: no field {key!r} (a `k3d run --json` output of this version?)")
    return doc[key]


def cost_from_list(text):
    try:
        costs = [float(c) for c in text.split(",")]
    except ValueError:
        fail(f"--cost {text!r}: not a comma-separated list of numbers")
    if not costs or any(not c > 0 for c in costs):
        fail(f"--cost {text!r}: every c(d) must be > 0")
    return [1.0] + costs


def cost_from_bench(paths, budget):
    """c(d) from `k3d bench --json` documents, one per prompt length K = d + 1."""
    ratios = {}
    for path in paths:
        doc = load(path)
        k = len(field(doc, "prompt_ids", path))
        budgets = field(doc, "budgets", path)
        chosen = [b for b in budgets if budget is None or b.get("ram_gb") == budget]
        if len(chosen) != 1:
            names = [b.get("ram_gb") for b in budgets]
            fail(f"{path}: budgets {names}; pick exactly one with --budget")
        median = field(chosen[0], "median", path)
        runs = field(chosen[0], "runs", path)
        # The prefill's tokens must be the K of the document: one forward of K ids.
        if any(r["prefill"]["tokens"] != k for r in runs):
            fail(f"{path}: prefill tokens differ from the prompt's {k}")
        per_token = median["decode_seconds_per_token"]
        if not per_token > 0:
            fail(f"{path}: decode_seconds_per_token {per_token} is not > 0")
        d = k - 1
        if d in ratios:
            fail(f"{path}: a second document for K = {k}")
        ratios[d] = median["prefill_seconds"] / per_token
    # A 1-token prefill is a plain forward, yet the first of its process (colder caches): its
    # ratio, when given, measures that bias and divides it out of the others.
    first = ratios.pop(0, 1.0)
    if first != 1.0:
        print(f"K = 1: prefill / decode token = {first:.3f}; c(d) divided by it")
    table = {0: 1.0, **{d: r / first for d, r in ratios.items()}}
    top = max(table)
    missing = [d for d in range(top + 1) if d not in table]
    if missing:
        fail(f"no bench document for d = {missing} (K = d + 1)")
    return [table[d] for d in range(top + 1)]


def histogram_text(counts):
    return " ".join(f"{i}:{n}" for i, n in enumerate(counts) if n)


def decode_ids_per_second(doc):
    decoded = len(doc["generated_ids"]) - 1
    return decoded / doc["decode_seconds"] if doc["decode_seconds"] > 0 else float("nan")


def report(path, doc, costs, plain):
    per_forward = field(doc, "drafts_per_forward", path)
    per_verify = field(doc, "accepted_per_verify", path)
    forwards = field(doc, "decode_forwards", path)
    decoded = len(field(doc, "generated_ids", path)) - 1
    if sum(per_forward) != forwards:
        fail(f"{path}: drafts_per_forward sums to {sum(per_forward)}, not {forwards}")
    if len(per_forward) > len(costs):
        fail(f"{path}: forwards with {len(per_forward) - 1} drafts, c(d) known up to "
             f"d = {len(costs) - 1}")
    verifies = sum(per_verify)
    accepted = sum(a * n for a, n in enumerate(per_verify))
    priced = sum(costs[d] * n for d, n in enumerate(per_forward))
    print(f"{path}: speculate {doc.get('speculate')}, {decoded} decoded ids in {forwards} forwards")
    print(f"  drafts per forward  {histogram_text(per_forward)}")
    print(f"  accepted per verify {histogram_text(per_verify)}")
    print(f"  ids per forward     {decoded / forwards:.2f}" if forwards else "  no forward")
    if verifies:
        print(f"  accepted per verify step {accepted / verifies:.2f} "
              f"({accepted} of {doc['drafts_proposed']} drafts in {verifies} verify steps)")
    if priced:
        print(f"  estimated speed-up  {decoded / priced:.2f}x "
              f"({decoded} plain forwards / {priced:.2f} priced)")
    if plain is not None:
        same = (doc["prompt_ids"], doc["generated_ids"]) == (plain["prompt_ids"],
                                                            plain["generated_ids"])
        print(f"  wall decode ids/s   {decode_ids_per_second(plain):.0f} off -> "
              f"{decode_ids_per_second(doc):.0f} on "
              f"({decode_ids_per_second(doc) / decode_ids_per_second(plain):.2f}x); "
              f"ids {'identical to' if same else 'DIFFER from'} plain")
        if not same:
            return False
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="`k3d run --json` outputs with --speculate N")
    parser.add_argument("--plain", help="the `k3d run --json` output of the same prompt, plain")
    table = parser.add_mutually_exclusive_group(required=True)
    table.add_argument("--cost", help="c(1),c(2),...: forward cost by drafts carried")
    table.add_argument("--bench", action="append",
                       help="a `k3d bench --json --prompt-tokens K` output (repeat per K)")
    parser.add_argument("--budget", help="the --ram-gb of the bench documents to use")
    args = parser.parse_args()
    costs = cost_from_list(args.cost) if args.cost else cost_from_bench(args.bench, args.budget)
    print("c(d) = " + ", ".join(f"{d}:{c:.3f}" for d, c in enumerate(costs)))
    plain = load(args.plain) if args.plain else None
    if plain is not None and any(field(plain, "drafts_per_forward", args.plain)[1:]):
        fail(f"{args.plain}: not a plain run (it has forwards with drafts)")
    ok = all([report(path, load(path), costs, plain) for path in args.runs])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
