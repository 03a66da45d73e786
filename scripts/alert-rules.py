#!/usr/bin/env python3
"""The alerts of k8s/monitoring/prometheusrule.yaml as a plain Prometheus rules file.

The PrometheusRule manifest is the only copy of the rules: scripts/test-alerts.sh (promtool
unit tests) and tests/it/alerts.rs (a real Prometheus server) both read them through this
script, so what they test is what the manifest ships.

Usage: alert-rules.py [--manifest PATH] [--alert NAME]... [--range DURATION]

Writes `groups:` (the manifest's spec.groups, unchanged) to stdout.
  --manifest  the PrometheusRule file (default: k8s/monitoring/prometheusrule.yaml beside
              this script's folder)
  --alert     keep only these alerts (repeatable); an unknown name is an error
  --range     set every range selector's duration in the kept expressions (`[5m]`) to
              DURATION; the rest of each expression stays as written
--range is for a test against a live server that cannot wait the manifest's minutes; the
promtool unit tests keep the manifest's ranges. Exit 2 with a message on bad input.
"""

import argparse
import os
import re
import sys

import yaml

# A Prometheus duration: one or more <number><unit> parts, e.g. 90s, 1m30s.
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
# A range selector's duration: `[5m]`, not a subquery's `[5m:1m]`.
RANGE = re.compile(r"\[([0-9]+(?:ms|s|m|h|d|w|y))+\]")


def duration(text):
    if not DURATION.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Prometheus duration (e.g. 30s, 1m)")
    return text


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--manifest", default=os.path.join(root, "k8s", "monitoring", "prometheusrule.yaml")
    )
    parser.add_argument("--alert", action="append", default=[])
    parser.add_argument("--range", type=duration, metavar="DURATION")
    args = parser.parse_args()

    with open(args.manifest) as f:
        manifest = yaml.safe_load(f)
    if manifest.get("kind") != "PrometheusRule":
        sys.exit(f"alert-rules: {args.manifest}: kind {manifest.get('kind')!r}, not PrometheusRule")
    groups = (manifest.get("spec") or {}).get("groups") or []
    names = {r["alert"] for g in groups for r in g.get("rules") or [] if "alert" in r}
    unknown = sorted(set(args.alert) - names)
    if unknown:
        print(f"alert-rules: --alert {', '.join(unknown)}: not in {args.manifest} "
              f"(it has {', '.join(sorted(names))})", file=sys.stderr)
        sys.exit(2)

    kept = []
    for group in groups:
        rules = [r for r in group.get("rules") or [] if not args.alert or r.get("alert") in args.alert]
        for rule in rules:
            if args.range:
                rule["expr"] = RANGE.sub(f"[{args.range}]", rule["expr"])
        if rules:
            kept.append({**group, "rules": rules})
    yaml.safe_dump({"groups": kept}, sys.stdout, sort_keys=False, width=1000)


if __name__ == "__main__":
    main()
