#!/usr/bin/env bash
# promtool unit tests of the alerts in k8s/monitoring/prometheusrule.yaml (tests/alerts/*.yaml).
# The rules are extracted from the manifest at each run (scripts/alert-rules.py), never copied.
#  1. Every alert of the manifest has a test where it fires and one where it stays silent, and
#     every test names an alert of the manifest (promtool passes an expected-silent test of a
#     misspelt alert).
#  2. `promtool test rules` passes on every file.
#  3. Self-test: copies of the rules broken on purpose (a threshold, a window, a `for:`, a
#     grouping or a matcher moved, one per line of MUTANTS) must each fail a test of
#     that alert.
# Needs promtool (Debian package prometheus) and python3-yaml, both installed by
# scripts/ensure-test-deps.sh. Run by tests/it/alerts.rs (so by scripts/test.sh and CI).
# Exit 0: all passed; 1: a test failed; 2: bad setup.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v promtool >/dev/null; then
  echo "test-alerts: promtool not found (Debian package prometheus)" >&2
  exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# alert|field|text in the manifest|broken text: each must make a test fail.
MUTANTS=(
  'SnowleaseLeaseLost|expr|> 0|>= 0'
  'SnowleaseLeaseLost|expr|[10m]|[11m]'
  'SnowleaseRenewFailing|expr|>= 3|>= 2'
  'SnowleaseRenewFailing|expr|>= 3|>= 4'
  'SnowleaseRenewFailing|expr|sum by (namespace, pod)|sum by (namespace)'
  'SnowleaseRenewFailing|expr|outcome="failed"|outcome=~"failed|renewed"'
  'SnowleaseNoLease|expr|== 0|<= 1'
  'SnowleaseNoLease|for|5m|4m'
  'SnowleaseNoLease|for|5m|6m'
  'SnowleaseWorkerIdsExhausted|expr|outcome="full"|outcome=~"full|paused"'
  'SnowleaseWorkerIdsExhausted|expr|[10m]|[9m]'
  'SnowleaseWorkerIdsNearlyExhausted|expr|>= 0.8|> 0.8'
  'SnowleaseWorkerIdsNearlyExhausted|expr|>= 0.8|>= 0.6'
  'SnowleaseWorkerIdsNearlyExhausted|for|10m|9m'
  'SnowleaseKeysRecreated|expr|> 0|>= 0'
  'SnowleaseKeysRecreated|expr|[30m]|[29m]'
)

# One folder per run of promtool: the rules as rules.yaml beside copies of the tests (promtool
# reads rule_files relative to the test file).
tests=(tests/alerts/*.yaml)
prepare() { # <folder> <rules file>
  mkdir -p "$1"
  cp "${tests[@]}" "$1/"
  cp "$2" "$1/rules.yaml"
}

python3 scripts/alert-rules.py >"$work/rules.yaml"

python3 - "$work/rules.yaml" "${tests[@]}" <<'EOF'
import os, sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))
alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
fires, silent, errors = set(), set(), []
for path in sys.argv[2:]:
    if os.path.basename(path) == "rules.yaml":
        errors.append(f"{path}: the name rules.yaml is the extracted rules'")
    test = yaml.safe_load(open(path))
    if test.get("rule_files") != ["rules.yaml"]:
        errors.append(f"{path}: rule_files must be [rules.yaml] (the rules extracted from the manifest)")
    for group in test.get("tests") or []:
        for case in group.get("alert_rule_test") or []:
            name = case["alertname"]
            if name not in alerts:
                errors.append(f"{path}: {group.get('name')!r}: alert {name} is not in the manifest")
            (fires if case.get("exp_alerts") else silent).add(name)
errors += [f"{a}: no test where it fires" for a in sorted(alerts - fires)]
errors += [f"{a}: no test where it stays silent" for a in sorted(alerts - silent)]
for e in dict.fromkeys(errors):
    print(f"test-alerts: {e}", file=sys.stderr)
sys.exit(1 if errors else 0)
EOF

prepare "$work/ok" "$work/rules.yaml"
promtool test rules "${tests[@]/#tests\/alerts\//$work/ok/}" >"$work/ok.log" 2>&1 || {
  cat "$work/ok.log" >&2
  echo "test-alerts: FAILED" >&2
  exit 1
}
echo "test-alerts: ${#tests[@]} files passed on the manifest's rules"

failed=0
for i in "${!MUTANTS[@]}"; do
  # The last field takes the rest of the line, so the broken text may hold a | itself.
  IFS='|' read -r alert field old new <<<"${MUTANTS[$i]}"
  dir="$work/mutant$i"
  mkdir -p "$dir"
  python3 - "$work/rules.yaml" "$dir/broken.yaml" "$alert" "$field" "$old" "$new" <<'EOF'
import sys, yaml
src, dst, alert, field, old, new = sys.argv[1:]
rules = yaml.safe_load(open(src))
rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert)
text = str(rule.get(field, ""))
if text.count(old) != 1:
    sys.exit(f"test-alerts: mutant {alert} {field}: {old!r} occurs {text.count(old)} times in {text!r}")
rule[field] = text.replace(old, new)
yaml.safe_dump(rules, open(dst, "w"), sort_keys=False, width=1000)
EOF
  promtool check rules "$dir/broken.yaml" >/dev/null || {
    echo "test-alerts: mutant '${MUTANTS[$i]}' is not a valid rules file" >&2
    exit 2
  }
  prepare "$dir" "$dir/broken.yaml"
  # The tests of that alert: a broken rule must fail its own tests.
  mapfile -t own < <(grep -l "alertname: $alert\$" "${tests[@]}")
  if promtool test rules "${own[@]/#tests\/alerts\//$dir/}" >"$dir/log" 2>&1; then
    echo "test-alerts: no test fails when $alert's $field has '$new' for '$old'" >&2
    failed=1
  fi
done
((failed == 0)) || exit 1
echo "test-alerts: each of ${#MUTANTS[@]} broken copies of the rules failed a test"
