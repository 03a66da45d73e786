#!/usr/bin/env bash
# Validates every manifest under k8s/ offline (scripts/validate_k8s.py says
# what is checked), then proves that the check catches broken manifests
# (self-test). Called by .ci/run. Installs kubernetes-validate (the
# Kubernetes JSON schemas ship inside the PyPI package) and promql-parser
# into a venv under target/ once; no cluster, no network after that. Needs
# kubectl (for `kubectl kustomize`) or kustomize on PATH.
#
# Usage: scripts/validate-k8s.sh            (K8S_VERSIONS="1.33.0 1.37.0")
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSIONS="${K8S_VERSIONS:-1.33.0 1.37.0}"
VENV="${SNOWLEASE_VALIDATE_VENV:-target/k8s-validate-venv}"
KV_PIN="kubernetes-validate==1.37.0"
PROMQL_PIN="promql-parser==0.11.0"

if ! "$VENV/bin/python" -c 'import kubernetes_validate, promql_parser' 2>/dev/null; then
  echo "validate-k8s: installing $KV_PIN $PROMQL_PIN into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "$KV_PIN" "$PROMQL_PIN"
fi

exec "$VENV/bin/python" scripts/validate_k8s.py "$K8S_VERSIONS" k8s
