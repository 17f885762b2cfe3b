#!/usr/bin/env bash
# Smoke test of the control plane with kubectl: starts it, checks that it is a real
# API server (CRD + CEL validation, RBAC, garbage collection, namespace deletion),
# prints its start-up time and RSS, stops it with SIGTERM and checks it exits 0.
# Usage: tests/controlplane/smoke.sh [path/to/controlplane]
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cp_bin=${1:-${NEURON_TOOLS_DIR:-$repo/target/tools}/bin/controlplane}
work=$(mktemp -d)
passed=0 failed=0
check() { # check NAME CMD...: CMD must succeed
    local name=$1
    shift
    if "$@" >"$work/out" 2>&1; then
        passed=$((passed + 1)) && echo "ok   $name"
    else
        failed=$((failed + 1)) && echo "FAIL $name" && sed 's/^/     /' "$work/out"
    fi
}

start=$(date +%s%N)
"$cp_bin" --state-dir "$work/state" >"$work/ready.json" &
pid=$!
until [[ -s $work/ready.json ]] || ! kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
ready_ms=$((($(date +%s%N) - start) / 1000000))
if ! [[ -s $work/ready.json ]]; then
    echo "FAIL control plane did not start"; tail -40 "$work/state/controlplane.log"
    echo "0 passed, 1 failed"
    exit 1
fi
echo "ready line: $(cat "$work/ready.json")"
export KUBECONFIG=$work/state/admin.kubeconfig
k() { kubectl "$@"; }

check "readyz" bash -c '[[ $(kubectl get --raw /readyz) == ok ]]'
check "api-resources lists CRDs and RBAC" bash -c \
    'kubectl api-resources >'"$work"'/res && grep -q customresourcedefinitions '"$work"'/res && grep -q clusterroles '"$work"'/res'
check "create namespace" k create namespace smoke
check "create configmap" k -n smoke create configmap c1 --from-literal=a=b

cat >"$work/crd.yaml" <<'EOF'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.smoke.example.com}
spec:
  group: smoke.example.com
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              min: {type: integer}
              max: {type: integer}
            x-kubernetes-validations:
            - rule: self.min <= self.max
              message: min must not exceed max
EOF
widget() { printf 'apiVersion: smoke.example.com/v1\nkind: Widget\nmetadata: {name: %s, namespace: smoke}\nspec: {min: %s, max: %s}\n' "$@"; }
check "create CRD with a CEL rule" k apply -f "$work/crd.yaml"
check "CRD established" k wait --for=condition=Established crd/widgets.smoke.example.com --timeout=30s
check "valid object accepted" bash -c "$(declare -f widget); widget good 1 2 | kubectl apply -f -"
check "object breaking the CEL rule refused" bash -c "$(declare -f widget)"'
    ! widget bad 3 2 | kubectl apply -f - 2>'"$work"'/err; cat '"$work"'/err; grep -q "min must not exceed max" '"$work"'/err'

check "create service account" k -n smoke create serviceaccount sa
check "service account without RBAC is forbidden" bash -c \
    '! kubectl -n smoke --as=system:serviceaccount:smoke:sa get configmaps 2>'"$work"'/err; cat '"$work"'/err; grep -q Forbidden '"$work"'/err'

gc_start=$(date +%s%N)
check "child of a deleted owner is garbage-collected" bash -c '
    kubectl -n smoke create configmap owner --from-literal=x=y >/dev/null
    uid=$(kubectl -n smoke get configmap owner -o jsonpath={.metadata.uid})
    printf "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: child\n  namespace: smoke\n  ownerReferences:\n  - {apiVersion: v1, kind: ConfigMap, name: owner, uid: %s}\n" "$uid" | kubectl apply -f -
    kubectl -n smoke delete configmap owner
    for _ in $(seq 50); do kubectl -n smoke get configmap child >/dev/null 2>&1 || exit 0; sleep 0.2; done
    exit 1'
gc_ms=$((($(date +%s%N) - gc_start) / 1000000))
check "namespace deletion completes" k delete namespace smoke --timeout=60s

rss_kb=$(awk '/VmRSS/ { print $2 }' "/proc/$pid/status")
stop=$(date +%s%N)
kill -TERM "$pid"
wait "$pid"
rc=$?
stop_ms=$((($(date +%s%N) - stop) / 1000000))
check "SIGTERM: clean exit 0" test "$rc" = 0

echo "start to ready: ${ready_ms} ms; RSS after the checks: $((rss_kb / 1024)) MiB; owner-deleted to child-gone (incl. kubectl): ${gc_ms} ms; shutdown: ${stop_ms} ms"
rm -rf "$work"
echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
