#!/bin/bash
# The orchestrator's own image (deploy/kubernetes/Dockerfile), run as deploy/kubernetes/deployment.yaml
# runs it — root with only the capabilities listed there, no privilege escalation, a read-only root
# with its own /tmp and /run, its settings, the hostPath data variant, authenticated as the shipped
# ServiceAccount bound to the shipped Role only — against the local cluster, then
# `orchestrator smoke --backend kubernetes` against it. Everything it made is removed at the end.
#
# It runs in the host's Docker engine rather than as a pod: pods of the local cluster live in the
# node's network namespace, which has only `lo`, so an orchestrator pod could reach neither the
# API server (127.0.0.1:6443 of the host) nor PyPI for the egress check (docs/kubernetes.md).
#
#   bash deploy/kubernetes/local/orchestrator-smoke.sh
# Env: KUBECONFIG (default /tmp/k8s-local/k8s/kubeconfig), NODE_ENGINE (the node's docker),
# SANDBOX_IMAGE (default: the newest sandbox-orchestrator/sandbox tag in the node's engine other
# than latest), PORT (8731), ORCH_SANDBOX_UID_BASE / ORCH_MAX_USER_ID (a uid block of your own).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
PY=$REPO/.venv/bin/python
export KUBECONFIG=${KUBECONFIG:-/tmp/k8s-local/k8s/kubeconfig}
NODE_ENGINE=${NODE_ENGINE:-unix:///tmp/k8s-local/dockerd/docker.sock}
PORT=${PORT:-8731}
UID_BASE=${ORCH_SANDBOX_UID_BASE:-320000000}; MAX_USER=${ORCH_MAX_USER_ID:-100000}
IMAGE=sandbox-orchestrator/orchestrator:smoke
SANDBOX_IMAGE=${SANDBOX_IMAGE:-$(docker -H "$NODE_ENGINE" images --format '{{.Repository}}:{{.Tag}}' sandbox-orchestrator/sandbox | grep -v ':latest$' | head -1)}
NS=so-orchestrator-smoke-$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')
WORK=/var/lib/$NS  # not under /tmp: the data dir may not be inside a directory others can write
CONTAINER=$NS

cleanup() {
  docker rm -f "$CONTAINER" >/dev/null 2>&1 || true
  kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== the orchestrator image"
"$PY" -m pip wheel --quiet --wheel-dir "$REPO/deploy/kubernetes/.wheelhouse" "$REPO" pip
BASE=$(docker images --format '{{.Repository}}:{{.Tag}}' sandbox-orchestrator/base | head -1)
docker build -q --network none --build-arg BASE_IMAGE="${BASE:-python:3.11-slim}" -t $IMAGE "$REPO/deploy/kubernetes" >/dev/null

echo "== namespace $NS, the shipped ServiceAccount, Role and RoleBinding"
kubectl create namespace "$NS" >/dev/null
sed "s/namespace: sandbox-orchestrator$/namespace: $NS/" "$REPO/deploy/kubernetes/rbac.yaml" | kubectl apply -f - >/dev/null
mkdir -p -m 0755 "$WORK/data" "$WORK/etc"
for _ in $(seq 100); do  # 1.20: the token controller makes the account's token Secret
  SECRET=$(kubectl -n "$NS" get serviceaccount sandbox-orchestrator -o jsonpath='{.secrets[0].name}' 2>/dev/null || true)
  [ -n "$SECRET" ] && break; sleep 0.2
done
kubectl -n "$NS" get secret "$SECRET" -o jsonpath='{.data.ca\.crt}' | base64 -d > "$WORK/etc/ca.crt"
SERVER=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
cat > "$WORK/etc/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$SERVER", certificate-authority: /etc/orchestrator/ca.crt}}]
users: [{name: sandbox-orchestrator, user: {token: "$(kubectl -n "$NS" get secret "$SECRET" -o jsonpath='{.data.token}' | base64 -d)"}}]
contexts: [{name: sa, context: {cluster: local, user: sandbox-orchestrator}}]
current-context: sa
EOF
head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$WORK/etc/api"; head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$WORK/etc/admin"
chmod 0600 "$WORK"/etc/*

echo "== the orchestrator, with the Deployment's security context"
# The capabilities and the user, read from the shipped Deployment (not repeated here).
read -r RUN_AS CAPS < <("$PY" - "$REPO/deploy/kubernetes/deployment.yaml" <<'EOF'
import sys, yaml
(pod,) = [d["spec"]["template"]["spec"] for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Deployment"]
context = pod["containers"][0]["securityContext"]
assert context["capabilities"]["drop"] == ["ALL"] and context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
print(f"{context['runAsUser']}:{context['runAsGroup']}", " ".join("--cap-add " + c for c in context["capabilities"]["add"]))
EOF
)
# shellcheck disable=SC2086
docker run -d --name "$CONTAINER" --network host --user "$RUN_AS" --cap-drop ALL $CAPS \
  --security-opt no-new-privileges --read-only --tmpfs /tmp --tmpfs /run:size=16m \
  -v "$WORK/data:$WORK/data" -v "$WORK/etc:/etc/orchestrator:ro" \
  -e ORCH_BACKEND=kubernetes -e ORCH_K8S_NAMESPACE="$NS" -e ORCH_DATA_DIR="$WORK/data" \
  -e ORCH_K8S_KUBECONFIG=/etc/orchestrator/kubeconfig -e ORCH_DISK_QUOTA=scan \
  -e ORCH_SANDBOX_IMAGE="$SANDBOX_IMAGE" -e ORCH_K8S_IMAGE_PULL_POLICY=Never \
  -e ORCH_SANDBOX_CPUS=0.2 -e ORCH_SANDBOX_MEMORY_MB=512 \
  -e ORCH_SANDBOX_UID_BASE="$UID_BASE" -e ORCH_MAX_USER_ID="$MAX_USER" \
  -e ORCH_API_TOKEN="$(cat "$WORK/etc/api")" -e ORCH_ADMIN_TOKEN="$(cat "$WORK/etc/admin")" \
  $IMAGE serve --host 127.0.0.1 --port "$PORT" >/dev/null
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null && break; sleep 0.3; done
# The Deployment's readiness probe, as the kubelet would exec it in the container (its port
# changed to this one).
mapfile -d '' PROBE < <("$PY" - "$REPO/deploy/kubernetes/deployment.yaml" "$PORT" <<'EOF'
import sys, yaml
(pod,) = [d["spec"]["template"]["spec"] for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Deployment"]
for arg in pod["containers"][0]["readinessProbe"]["exec"]["command"]:
    sys.stdout.write(arg.replace(":8700/", f":{sys.argv[2]}/") + "\0")
EOF
)
docker exec "$CONTAINER" "${PROBE[@]}" || { echo "the readiness probe failed" >&2; exit 1; }
echo "readiness probe: ok"

echo "== orchestrator smoke --backend kubernetes"
status=0
"$REPO/.venv/bin/orchestrator" smoke --url "http://127.0.0.1:$PORT" --token "$(cat "$WORK/etc/api")" \
  --admin-token "$(cat "$WORK/etc/admin")" --backend kubernetes --owner-user 41 --member-user 42 || status=$?
docker logs "$CONTAINER" 2>&1 | grep -E " (ERROR|WARNING) " | grep -v "process-backend sandboxes are NOT isolated" || true
# What the smoke cannot see: without FSETID a chmod by root silently drops the setgid bit of a
# directory whose group root is not in, so files made in share/ would not get its group.
mode=$(stat -c %a "$WORK/data/share")
[ "$mode" = 3770 ] || { echo "share/ has mode $mode, not 3770: a capability of deployment.yaml is missing" >&2; status=1; }
exit $status
