#!/usr/bin/env bash
# Installs the test tools, pinned and cached under $NEURON_TOOLS_DIR (default
# <repo>/target/tools), binaries in its bin/:
#   controlplane  etcd + kube-apiserver + GC/namespace/SA controllers (tests/controlplane)
#   helm          go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION
#   localstack    pip install localstack-core[base-runtime]==$LOCALSTACK_VERSION into
#                 localstack/venv (Python >= 3.12, from pyenv), its service catalog prebuilt in
#                 localstack/static; the CloudWatch of the tests, no Docker (started by
#                 node-agent/tests/support/cloudwatch.rs through tests/tools/localstack_launcher.py);
#                 plus moto-ext==$MOTO_VERSION, the backend of its CloudWatch Logs
#   prometheus, promtool   Debian's `prometheus` package (on PATH, /usr/bin)
#   prometheus3   go install -tags remove_all_sd github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS3_VERSION,
#                 renamed: Prometheus 3, whose OTLP receiver (--web.enable-otlp-receiver) the
#                 OTLP tests push to; Debian's 2.x keeps serving the scrape tests
#   systemd-analyze        Debian's `systemd` package (on PATH, /usr/bin), for the unit of
#                          deploy/ec2 (tests/e2e/tests/deploy.rs); nothing is started
#   openssl       Debian's package: the CloudWatch add-on test's certificates
#   the real node of tests/realnode.sh:
#     Debian's containerd, runc, containernetworking-plugins (/usr/lib/cni), umoci (the
#     images), iptables and conntrack (kube-proxy); nothing is started
#     kubelet, kube-scheduler, kube-proxy  go build from tests/controlplane's module: the
#                 same Kubernetes version and replace block as the control plane
#     pause       tests/controlplane/pause, static: the pod sandbox image's program
#     neuron-sim-deviceplugin  tests/controlplane/deviceplugin: the test device plugin
#                 (Neuron devices, NeuronCores, EFA of the simulated instance type)
#     neuron-sim-dradriver  tests/controlplane/dradriver: the test DRA driver (neuron.aws.com,
#                 REALNODE_ALLOCATION=dra), built against the default Kubernetes version
# Idempotent: each step is skipped when its stamp (pinned version or source hash)
# matches. Each step prints one line; a warm run takes a few seconds.
# Go caches stay at their defaults (~/.cache/go-build, ~/go/pkg/mod).
set -euo pipefail

HELM_VERSION=v3.22.0
# Prometheus 3's Go module version (v0.3xx.y); remove_all_sd leaves out the service
# discoveries, one of whose dependencies the module proxy refuses.
PROMETHEUS3_VERSION=v0.316.0
LOCALSTACK_VERSION=2026.3.0
# Upper bounds on dependencies localstack-core leaves open, found necessary with this
# version (with cbor2 6 it finds "no component plugins"), and service-identity, which
# its TLS setup wants.
LOCALSTACK_PINS=("cbor2<6" "pyopenssl<26" "cryptography<47" "service-identity")
# CloudWatch Logs in LocalStack runs on moto (its `runtime` extra, which brings every
# service's dependencies; the logs backend needs moto-ext alone). The lowest version
# localstack-core 2026.3.0 accepts.
MOTO_VERSION=5.1.22

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tools=${NEURON_TOOLS_DIR:-$repo/target/tools}
bin=$tools/bin
stamps=$tools/stamps
mkdir -p "$bin" "$stamps"
started=$SECONDS

# One install at a time per tools dir.
exec 9>"$tools/.lock"
flock 9

# Never let `go` fetch another toolchain: there is none to fetch here.
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly

# The Kubernetes version of the control plane and the real node: by default the one
# tests/controlplane/go.mod pins; NEURON_K8S_VERSION=1.33 (or another directory of
# tests/controlplane/k8s-versions) builds the same sources against that version's go.mod
# and go.sum into $tools/k8s-v<version>/bin, which tests/tools/env.sh then puts first on
# PATH.
k8s_src=$repo/tests/controlplane
k8s_bin=$bin
k8s_stamp=
if [[ -n ${NEURON_K8S_VERSION:-} ]]; then
    versions=$repo/tests/controlplane/k8s-versions
    if [[ ! -f $versions/v$NEURON_K8S_VERSION/go.mod ]]; then
        echo "install.sh: NEURON_K8S_VERSION=$NEURON_K8S_VERSION: no $versions/v$NEURON_K8S_VERSION/go.mod (known: $(ls "$versions" | tr '\n' ' '))" >&2
        exit 1
    fi
    k8s_src=$tools/k8s-v$NEURON_K8S_VERSION/src
    k8s_bin=$tools/k8s-v$NEURON_K8S_VERSION/bin
    k8s_stamp=-v$NEURON_K8S_VERSION
    rm -rf "$k8s_src"
    mkdir -p "$k8s_src" "$k8s_bin"
    cp "$repo"/tests/controlplane/*.go "$k8s_src/"
    cp -r "$repo/tests/controlplane/pause" "$k8s_src/"
    # The version's go.mod and go.sum, and its own copy of any source file whose calls
    # differ in that release.
    cp "$versions/v$NEURON_K8S_VERSION"/go.{mod,sum} "$k8s_src/"
    cp "$versions/v$NEURON_K8S_VERSION"/*.go "$k8s_src/" 2>/dev/null || true
fi

step() { printf '%-13s %s\n' "$1:" "$2"; }

# quiet NAME CMD...: runs CMD with its output in logs/NAME.log, shown only if it fails.
quiet() {
    local log=$tools/logs/$1.log
    shift
    mkdir -p "$tools/logs"
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        echo "install.sh: failed: $*" >&2
        return 1
    fi
}

# stamped NAME VALUE: true when NAME's stamp holds VALUE and every further
# argument (a file that step produces) exists.
stamped() {
    local name=$1 value=$2
    shift 2
    [[ -f $stamps/$name && $(<"$stamps/$name") == "$value" ]] || return 1
    local f
    for f in "$@"; do [[ -x $f ]] || return 1; done
}

install_controlplane() {
    local src=$k8s_src bin=$k8s_bin
    local k8s_version
    k8s_version=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$src/go.mod")
    local hash
    hash=$( (cd "$src" && cat go.mod go.sum ./*.go && go env GOVERSION) | sha256sum | cut -c1-16)
    if stamped "controlplane$k8s_stamp" "$hash" "$bin/controlplane"; then
        step controlplane "cached (k8s $k8s_version, source $hash)"
        return
    fi
    local t=$SECONDS major minor
    IFS=. read -r major minor _ <<<"${k8s_version#v}"
    # The version kube-apiserver reports on /version (what kubectl and helm see).
    local pkg=k8s.io/component-base/version
    (cd "$src" && quiet controlplane go build -trimpath \
        -ldflags "-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
        -o "$bin/controlplane.tmp" .)
    mv "$bin/controlplane.tmp" "$bin/controlplane"
    echo "$hash" >"$stamps/controlplane$k8s_stamp"
    step controlplane "built in $((SECONDS - t))s (k8s $k8s_version, source $hash)"
}

install_helm() {
    if stamped helm "$HELM_VERSION" "$bin/helm"; then
        step helm "cached ($HELM_VERSION)"
        return
    fi
    local t=$SECONDS gomod k8s_minor
    # As helm's release build: its version, and the Kubernetes version that
    # `helm template`/`helm lint` assume (from the client-go it is built with;
    # without it they assume v1.20).
    gomod=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
    k8s_minor=$(awk '$1 == "k8s.io/client-go" { split($2, v, "."); print v[2]; exit }' "$gomod")
    local v=helm.sh/helm/v3/internal/version c=helm.sh/helm/v3/pkg/chartutil r=helm.sh/helm/v3/pkg/lint/rules
    quiet helm env GOBIN="$bin" go install -trimpath -ldflags "-s -w -X $v.version=$HELM_VERSION -X $v.metadata= \
        -X $c.k8sVersionMajor=1 -X $c.k8sVersionMinor=$k8s_minor -X $r.k8sVersionMajor=1 -X $r.k8sVersionMinor=$k8s_minor" \
        "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    echo "$HELM_VERSION" >"$stamps/helm"
    step helm "installed $HELM_VERSION (assumes Kubernetes v1.$k8s_minor) in $((SECONDS - t))s"
}

# A Python >= 3.12 for LocalStack (the machines' default python3 is 3.11): the newest
# 3.13 or 3.12 of pyenv (found without pyenv on PATH too), else python3.13 / python3.12
# on PATH.
localstack_python() {
    local root candidates=() c
    root=$(pyenv root 2>/dev/null) || root=${PYENV_ROOT:-$HOME/.pyenv}
    mapfile -t candidates < <(printf '%s/bin/python3\n' "$root"/versions/3.1[23]* | sort -rV)
    candidates+=("$(command -v python3.13 || true)" "$(command -v python3.12 || true)")
    for c in "${candidates[@]}"; do
        [[ -n $c && -x $c ]] || continue
        if "$c" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            echo "$c"
            return
        fi
    done
    return 1
}

install_localstack() {
    local dir=$tools/localstack python version
    if ! python=$(localstack_python); then
        step localstack "NOT INSTALLED: no Python >= 3.12 (pyenv versions or python3.12/python3.13 on PATH)"
        return 1
    fi
    version=$("$python" -c 'import platform; print(platform.python_version())')
    local stamp="localstack-core $LOCALSTACK_VERSION ${LOCALSTACK_PINS[*]} python $version"
    if stamped localstack "$stamp" "$dir/venv/bin/python" && compgen -G "$dir/static/usr/lib/localstack/service-catalog-*" >/dev/null; then
        step localstack "cached ($LOCALSTACK_VERSION, Python $version)"
        return
    fi
    local t=$SECONDS
    # A fresh venv: nothing of an older version's dependencies stays behind (the stamp,
    # written last, marks it complete).
    rm -rf "$dir/venv"
    quiet localstack "$python" -m venv "$dir/venv"
    quiet localstack "$dir/venv/bin/python" -m pip install --no-input \
        "localstack-core[base-runtime]==$LOCALSTACK_VERSION" "${LOCALSTACK_PINS[@]}"
    # LocalStack's index of every AWS service spec, built here once as its Docker image
    # does at build time (else each start builds it: 3-6 s and ~370 MB more RSS). The
    # tests link each instance's static-libs dir to this one.
    rm -rf "$dir/static"
    mkdir -p "$dir/static/usr/lib/localstack"
    quiet localstack env OVERRIDE_IN_DOCKER=0 LOCALSTACK_TELEMETRY=0 FILESYSTEM_ROOT="$dir/static" \
        "$dir/venv/bin/python" -m localstack.aws.spec
    echo "$stamp" >"$stamps/localstack"
    step localstack "installed $LOCALSTACK_VERSION (Python $version) in $((SECONDS - t))s"
}

# Added to the venv (nothing else of it changes, so LocalStacks running from it are
# undisturbed); again whenever the venv was made anew.
install_localstack_logs() {
    local dir=$tools/localstack
    local stamp="moto-ext $MOTO_VERSION on $(cat "$stamps/localstack" 2>/dev/null)"
    if stamped localstack-logs "$stamp" "$dir/venv/bin/python" && "$dir/venv/bin/python" -c 'import moto.logs' 2>/dev/null; then
        step localstack "logs backend cached (moto-ext $MOTO_VERSION)"
        return
    fi
    local t=$SECONDS
    quiet localstack-logs "$dir/venv/bin/python" -m pip install --no-input "moto-ext==$MOTO_VERSION" "${LOCALSTACK_PINS[@]}"
    echo "$stamp" >"$stamps/localstack-logs"
    step localstack "logs backend installed (moto-ext $MOTO_VERSION) in $((SECONDS - t))s"
}

as_root() {
    if [[ $(id -u) == 0 ]]; then "$@"; else sudo -n "$@"; fi
}

# apt_install LOG PACKAGE...: installs Debian packages without starting their services
# (invoke-rc.d asks policy-rc.d, which says no while it runs).
apt_install() {
    local log=$1 policy=/usr/sbin/policy-rc.d added_policy=
    shift
    if [[ ! -e $policy ]]; then
        as_root sh -c "printf '#!/bin/sh\nexit 101\n' >$policy && chmod 755 $policy"
        added_policy=1
    fi
    quiet "$log" as_root apt-get update
    quiet "$log" as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
    [[ -z $added_policy ]] || as_root rm -f "$policy"
}

install_prometheus() {
    if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
        step prometheus "cached ($(prometheus --version 2>&1 | awk 'NR == 1 { print $3; exit }'), Debian package)"
        return
    fi
    local t=$SECONDS
    apt_install prometheus prometheus
    # Where systemd runs the service anyway, stop and disable it.
    if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
        as_root systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
    step prometheus "installed $(prometheus --version 2>&1 | awk 'NR == 1 { print $3; exit }') (Debian package) in $((SECONDS - t))s"
}

install_prometheus3() {
    if stamped prometheus3 "$PROMETHEUS3_VERSION" "$bin/prometheus3"; then
        step prometheus3 "cached ($PROMETHEUS3_VERSION)"
        return
    fi
    local t=$SECONDS tmp=$tools/prometheus3.tmp
    rm -rf "$tmp"
    mkdir -p "$tmp"
    quiet prometheus3 env GOBIN="$tmp" go install -trimpath -tags remove_all_sd -ldflags "-s -w" \
        "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS3_VERSION"
    mv "$tmp/prometheus" "$bin/prometheus3"
    rm -rf "$tmp"
    echo "$PROMETHEUS3_VERSION" >"$stamps/prometheus3"
    step prometheus3 "installed $PROMETHEUS3_VERSION in $((SECONDS - t))s"
}

# systemd-analyze only: the package is installed, never booted or started (no systemd
# runs in these containers; `verify` and `security --offline` read files).
install_systemd_analyze() {
    if command -v systemd-analyze >/dev/null; then
        step systemd "cached ($(systemd-analyze --version | awk 'NR == 1 { print $2; exit }'), Debian package)"
        return
    fi
    local t=$SECONDS
    quiet systemd as_root apt-get update
    quiet systemd as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends systemd
    step systemd "installed $(systemd-analyze --version | awk 'NR == 1 { print $2; exit }') (Debian package) in $((SECONDS - t))s"
}

# The openssl command: the CloudWatch add-on test makes its certificates as the add-on's
# chart does.
install_openssl() {
    if command -v openssl >/dev/null; then
        step openssl "cached ($(openssl version | awk '{ print $2 }'), Debian package)"
        return
    fi
    local t=$SECONDS
    apt_install openssl openssl
    step openssl "installed $(openssl version | awk '{ print $2 }') (Debian package) in $((SECONDS - t))s"
}

# The real node's runtime: Debian packages, checked by the commands they bring.
NODE_PACKAGES=(containerd runc containernetworking-plugins umoci iptables conntrack)
install_node_packages() {
    if command -v containerd >/dev/null && command -v runc >/dev/null && command -v ctr >/dev/null &&
        command -v umoci >/dev/null && command -v iptables >/dev/null && command -v conntrack >/dev/null &&
        [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]]; then
        step node-runtime "cached (containerd $(containerd --version | awk '{ print $3 }'), Debian packages)"
        return
    fi
    local t=$SECONDS
    apt_install node-runtime "${NODE_PACKAGES[@]}"
    step node-runtime "installed ${NODE_PACKAGES[*]} (Debian packages) in $((SECONDS - t))s"
}

# kubelet, kube-scheduler and kube-proxy from the control plane's module (its go.mod
# lists them as tools, so go.sum covers them), and the static pause program.
install_node_binaries() {
    local src=$k8s_src bin=$k8s_bin
    local k8s_version hash
    k8s_version=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$src/go.mod")
    hash=$( (cd "$src" && cat go.mod go.sum pause/*.go && go env GOVERSION) | sha256sum | cut -c1-16)
    if stamped "node$k8s_stamp" "$hash" "$bin/kubelet" "$bin/kube-scheduler" "$bin/kube-proxy" "$bin/pause"; then
        step node "cached (k8s $k8s_version, source $hash)"
        return
    fi
    local t=$SECONDS major minor tmp=$tools/node.tmp
    IFS=. read -r major minor _ <<<"${k8s_version#v}"
    local pkg=k8s.io/component-base/version
    rm -rf "$tmp"
    mkdir -p "$tmp"
    (cd "$src" && quiet node go build -trimpath \
        -ldflags "-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
        -o "$tmp/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy)
    (cd "$src" && quiet node env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/pause" ./pause)
    mv "$tmp"/* "$bin/"
    rm -rf "$tmp"
    echo "$hash" >"$stamps/node$k8s_stamp"
    step node "built kubelet, kube-scheduler, kube-proxy, pause in $((SECONDS - t))s (k8s $k8s_version, source $hash)"
}

# The test device plugin (tests/controlplane/deviceplugin), apart from the node's
# binaries: a change to it does not rebuild the kubelet.
install_deviceplugin() {
    local src=$repo/tests/controlplane hash
    hash=$( (cd "$src" && cat go.mod go.sum deviceplugin/*.go && go env GOVERSION) | sha256sum | cut -c1-16)
    if stamped deviceplugin "$hash" "$bin/neuron-sim-deviceplugin"; then
        step deviceplugin "cached (source $hash)"
        return
    fi
    local t=$SECONDS
    (cd "$src" && quiet deviceplugin go build -trimpath -ldflags "-s -w" -o "$bin/neuron-sim-deviceplugin.tmp" ./deviceplugin)
    mv "$bin/neuron-sim-deviceplugin.tmp" "$bin/neuron-sim-deviceplugin"
    echo "$hash" >"$stamps/deviceplugin"
    step deviceplugin "built neuron-sim-deviceplugin in $((SECONDS - t))s (source $hash)"
}

# The test DRA driver (tests/controlplane/dradriver), like the device plugin.
install_dradriver() {
    local src=$repo/tests/controlplane hash
    hash=$( (cd "$src" && cat go.mod go.sum dradriver/*.go && go env GOVERSION) | sha256sum | cut -c1-16)
    if stamped dradriver "$hash" "$bin/neuron-sim-dradriver"; then
        step dradriver "cached (source $hash)"
        return
    fi
    local t=$SECONDS
    (cd "$src" && quiet dradriver go build -trimpath -ldflags "-s -w" -o "$bin/neuron-sim-dradriver.tmp" ./dradriver)
    mv "$bin/neuron-sim-dradriver.tmp" "$bin/neuron-sim-dradriver"
    echo "$hash" >"$stamps/dradriver"
    step dradriver "built neuron-sim-dradriver in $((SECONDS - t))s (source $hash)"
}

install_controlplane
install_helm
install_localstack
install_localstack_logs
install_prometheus
install_prometheus3
install_systemd_analyze
install_openssl
install_node_packages
install_node_binaries
install_deviceplugin
install_dradriver
echo "tools ready in $tools/bin ($((SECONDS - started))s)"
